"""The compatibility gate: driver x GPU x CUDA build x engine release -> verdict.

:func:`check` applies these rules, each result citing the CSV row it used (see ``compat_data``):

``gpu-arch``
    The CUDA build can target the GPU's compute capability: first toolkit per architecture
    (Blackwell needs >= 12.8) and last toolkit major (Volta ends with 12.x, so CUDA 13 builds
    start at 7.5). Source: gpu_compute_capability.csv (NVIDIA architecture matrix).
``gpu-driver-branch``
    The driver branch supports the GPU: last branch (R580 for Maxwell/Pascal/Volta, R470 for
    Kepler), explicit minima (Blackwell R570+). Source: gpu_compute_capability.csv.
``toolkit-min-driver``
    Driver >= the toolkit's own Linux minimum. Source: cuda_driver_min.csv (CUDA release notes,
    Table 3).
``minor-version-compat``
    Below the toolkit minimum a build still runs if the driver is >= its major's floor
    (13.x: 580, 12.x: 525.60.13, 11.x: 450.80.02). Source: cuda_driver_min.csv.
``ptx-jit``
    PTX JIT and newer-driver APIs need the toolkit minimum: a warning under minor-version
    compatibility, a failure when the release declares it JIT-compiles PTX (``ptx_jit``).
``forward-compat``
    Below the floor only the cuda-compat package helps, and only if the release declares it, the
    GPU is a data-center part and the driver is on an LTSB or PB branch
    (:data:`DRIVER_BRANCHES`).
``engine-build``
    The engine release publishes a build for the CUDA version (engine_requirements.csv).
``data-provenance``
    A warning when a row used is marked third-party, unverified or approximate.

Verdict: any ``fail`` -> INCOMPATIBLE (exit 1); else any ``warn`` -> COMPATIBLE_WITH_WARNINGS;
else COMPATIBLE (both exit 0). Bad input raises :class:`CompatInputError` (exit 2).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from gpuobs.reference.compat import (
    ENGINE_CSV,
    CompatInputError,
    CudaRelease,
    CudaVersion,
    DriverVersion,
    EngineRow,
    Gpu,
    engine_rows,
    lookup_cuda,
    parse_cuda,
    parse_driver,
    resolve_gpu,
    torch_row,
)

PASS, WARN, FAIL = "pass", "warn", "fail"
COMPATIBLE = "COMPATIBLE"
COMPATIBLE_WITH_WARNINGS = "COMPATIBLE_WITH_WARNINGS"
INCOMPATIBLE = "INCOMPATIBLE"

#: Linux data-center driver branches: number -> (type, lifecycle note). LTSB = long-term support,
#: PB = production, NFB = new-feature (no forward compatibility). Source: :data:`BRANCH_SOURCE`.
DRIVER_BRANCHES: dict[int, tuple[str, str]] = {
    535: ("LTSB", "EOL Jun 2026"),
    570: ("PB", "EOL Feb 2026"),
    580: ("LTSB", "EOL 2028, last for Maxwell/Pascal/Volta"),
    595: ("PB", "EOL Mar 2027"),
    610: ("NFB", "new-feature branch"),
    620: ("LTSB", "EOL Sep 2029"),
}
BRANCH_SOURCE = "gpuobs/reference/data/README.md driver branches (NVIDIA driver lifecycle: R535 LTSB ... R620 LTSB)"
FORWARD_COMPAT_BRANCH_TYPES = ("LTSB", "PB")


@dataclass(frozen=True)
class RuleResult:
    """One applied rule: ``rule`` id, ``status`` pass|warn|fail, ``message``, ``source`` (the
    CSV file, row and that row's ``source`` cell)."""

    rule: str
    status: str
    message: str
    source: str

    def to_dict(self) -> dict[str, str]:
        """``{"rule", "status", "message", "source"}``."""
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """The gate's answer: ``verdict`` (COMPATIBLE | COMPATIBLE_WITH_WARNINGS | INCOMPATIBLE),
    the ``rules`` applied in order, and the resolved ``inputs`` (strings and booleans)."""

    verdict: str
    rules: tuple[RuleResult, ...]
    inputs: dict[str, object] = field(default_factory=dict)

    @classmethod
    def from_rules(cls, rules: list[RuleResult], inputs: dict[str, object]) -> Verdict:
        """Combine rule results: any fail -> INCOMPATIBLE, any warn -> with warnings."""
        statuses = {r.status for r in rules}
        verdict = INCOMPATIBLE if FAIL in statuses else COMPATIBLE_WITH_WARNINGS if WARN in statuses else COMPATIBLE
        return cls(verdict, tuple(rules), inputs)

    @property
    def exit_code(self) -> int:
        """0 for COMPATIBLE and COMPATIBLE_WITH_WARNINGS, 1 for INCOMPATIBLE (:mod:`gpuobs.core.errors`)."""
        return 1 if self.verdict == INCOMPATIBLE else 0

    def failed(self) -> list[str]:
        """Ids of the rules that failed, in order."""
        return [r.rule for r in self.rules if r.status == FAIL]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready ``{"verdict", "exit_code", "inputs", "rules": [...]}``."""
        return {"verdict": self.verdict, "exit_code": self.exit_code, "inputs": dict(self.inputs),
                "rules": [r.to_dict() for r in self.rules]}


ENGINE_ALIASES = {"torch": "pytorch", "trtllm": "tensorrt-llm", "trt-llm": "tensorrt-llm",
                  "tensorrt_llm": "tensorrt-llm"}
ENGINE_ACCEPTED = "ENGINE==VERSION, e.g. vllm==0.6.3, pytorch==2.7, tensorrt-llm==1.2.0rc6"


@dataclass(frozen=True)
class EngineMatch:
    """An ``ENGINE==VERSION`` input (``given``) matched to its engine_requirements.csv ``row``."""

    given: str
    version: str
    row: EngineRow


def _release(text: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"(\d+(?:\.\d+)*)(?:\.?(?:rc|a|b)\d+)?(?:\.?post\d+)?(?:\.?dev\d+)?", text)
    return tuple(int(p) for p in m[1].split(".")) if m else None


def _spec_score(spec: str, version: str) -> int | None:
    """How specifically version cell ``spec`` covers ``version``: 3 same spelling (``1.2.0rc6``,
    ``main``), 2 numeric prefix (``2.7`` covers ``2.7.1``), 1 wildcard (``0.9.x``), 0 range
    (``<=0.6.3.x``, ``0.6.4-0.7.x``); None if it does not."""
    s = re.sub(r"^(?:NGC|Triton)\s+|\s+base$", "", re.sub(r"\([^)]*\)", "", spec).strip())
    v = _release(version)
    if s == version:
        return 3
    if v is None:
        return None

    def bound(b: str) -> tuple[int, ...] | None:
        return _release(b.removesuffix(".x")) if re.fullmatch(r"[\d.]+?(\.x)?", b) else None

    def head(n: int) -> tuple[int, ...]:
        return (v + (0,) * n)[:n]

    if s.startswith("<="):
        hi = bound(s[2:])
        return 0 if hi is not None and head(len(hi)) <= hi else None
    if "-" in s:
        lo, hi = (bound(p) for p in s.split("-", 1))
        return 0 if lo is not None and hi is not None and lo <= head(len(lo)) and head(len(hi)) <= hi else None
    b = bound(s)
    if b is None or head(len(b)) != b:
        return None
    return 1 if s.endswith(".x") else 2


def resolve_engine(text: object, field_name: str = "--engine") -> EngineMatch:
    """Match ``ENGINE==VERSION`` to its engine_requirements.csv row; the most specific row wins.

    Engines are the table's ``engine`` column plus aliases (torch, trtllm). Raises
    :class:`CompatInputError` for bad syntax, an unknown engine, or a version no row covers
    (listing that engine's versions).
    """
    m = re.fullmatch(r"\s*([A-Za-z][\w.-]*)\s*==\s*([\w.]+)\s*", str(text))
    if not m:
        raise CompatInputError(field_name, text, "not ENGINE==VERSION", ENGINE_ACCEPTED)
    name = ENGINE_ALIASES.get(m[1].lower(), m[1].lower())
    rows = [r for r in engine_rows() if r.engine == name]
    if not rows:
        engines = ", ".join(dict.fromkeys(r.engine for r in engine_rows()))
        raise CompatInputError(field_name, text, f"unknown engine {m[1]!r}",
                               f"{ENGINE_ACCEPTED}; engines: {engines} (aliases: torch, trtllm)")
    scored = [(s, r) for r in rows if (s := _spec_score(r.version_spec, m[2])) is not None]
    if not scored:
        raise CompatInputError(field_name, text, f"no {name} release {m[2]} in {ENGINE_CSV}",
                               f"{name} versions " + ", ".join(r.version_spec for r in rows))
    best = max(s for s, _ in scored)
    return EngineMatch(str(text).strip(), m[2], next(r for s, r in scored if s == best))


def forward_compat_eligible(gpu: Gpu, driver: DriverVersion) -> tuple[bool, str]:
    """Whether the cuda-compat package can run newer CUDA on ``driver`` for ``gpu``.

    Needs a data-center GPU (gpu_compute_capability.csv ``data_center_class``; NGC-ready RTX SKUs
    are not modelled) and a driver on an LTSB or PB branch (:data:`DRIVER_BRANCHES`). Returns
    ``(eligible, reason)``; an unknown branch or an sm/compute-capability name on a mixed row is
    not eligible (the gate does not guess).
    """
    reasons = []
    if gpu.data_center is False:
        reasons.append(f"{gpu.given} is not a data-center GPU")
    elif gpu.data_center is None:
        reasons.append(f"{gpu.given!r} does not tell whether the GPU is a data-center model (only "
                       f"{'/'.join(gpu.row.dc_models)} are); name it by modelName")
    branch = DRIVER_BRANCHES.get(driver.branch)
    known = ", ".join(f"R{b} {t}" for b, (t, _) in DRIVER_BRANCHES.items())
    if branch is None:
        reasons.append(f"R{driver.branch} is not a known LTSB/PB branch (known: {known})")
    elif branch[0] not in FORWARD_COMPAT_BRANCH_TYPES:
        reasons.append(f"R{driver.branch} is an {branch[0]} branch; forward compatibility needs LTSB or PB")
    if reasons:
        return False, "; ".join(reasons)
    return True, f"data-center GPU on R{driver.branch} {branch[0]} ({branch[1]})"


def _rule_gpu_arch(gpu: Gpu, cuda: CudaVersion) -> RuleResult:
    row, first = gpu.row, gpu.first_cuda
    last = f"{row.last_cuda_major}.x" if row.last_cuda_major is not None else "ongoing"
    name = f"{row.architecture} (compute capability {gpu.cc})"
    if first is not None and (cuda.major, cuda.minor) < (first.major, first.minor):
        return RuleResult("gpu-arch", FAIL, f"CUDA {cuda} cannot target {name}: first toolkit for it is "
                          f"{first}", row.cite())
    if row.last_cuda_major is not None and cuda.major > row.last_cuda_major:
        note = f" ({row.notes})" if row.notes else ""
        return RuleResult("gpu-arch", FAIL, f"CUDA {cuda} builds do not support {name}: last toolkit is "
                          f"{last}{note}", row.cite())
    return RuleResult("gpu-arch", PASS, f"CUDA {cuda} supports {name} (toolkits {first}..{last})", row.cite())


def check_gpu_driver(gpu: Gpu, driver: DriverVersion) -> RuleResult:
    """Rule ``gpu-driver-branch``: does the driver branch support ``gpu`` at all?

    Fails above the GPU's last branch or below an explicit minimum (gpu_compute_capability.csv);
    warns when the driver predates the minimum driver of the first toolkit for the architecture
    (an inference, flagged as such, with that cuda_driver_min.csv row cited too).
    """
    row = gpu.row
    arch = f"{row.architecture} ({gpu.given})"
    if row.jetpack:
        return RuleResult("gpu-driver-branch", WARN, f"{arch} is JetPack-managed; data-center driver "
                          "branches do not apply, check the JetPack release", row.cite())
    if row.last_branch is not None and driver.branch > row.last_branch:
        return RuleResult("gpu-driver-branch", FAIL, f"driver {driver} (R{driver.branch}) does not support "
                          f"{arch}: last branch is R{row.last_branch}", row.cite())
    if row.min_branch is not None and driver.branch < row.min_branch:
        return RuleResult("gpu-driver-branch", FAIL, f"{arch} needs driver branch R{row.min_branch}+; driver "
                          f"{driver} is R{driver.branch}", row.cite())
    intro = _intro_release(gpu)
    if intro is not None and intro.toolkit_min is not None and driver < intro.toolkit_min:
        return RuleResult("gpu-driver-branch", WARN, f"driver {driver} predates {intro.release}'s minimum "
                          f"{intro.toolkit_min}, the first toolkit for {row.architecture}: the driver may not "
                          "know this GPU (inferred from the tables, verify)", f"{row.cite()}; {intro.cite()}")
    limit = f", last branch R{row.last_branch}" if row.last_branch is not None else ""
    return RuleResult("gpu-driver-branch", PASS, f"driver {driver} (R{driver.branch}) supports {arch}{limit}",
                      row.cite())


def _intro_release(gpu: Gpu) -> CudaRelease | None:
    first = gpu.first_cuda
    if first is None:
        return None
    try:
        return lookup_cuda(CudaVersion(first.major, first.minor))
    except CompatInputError:  # toolkit older than the table (e.g. 9.0): nothing to infer
        return None


def _driver_rules(drv: DriverVersion, gpu: Gpu, cuda: CudaVersion, row: CudaRelease, ptx_jit: bool,
                  cuda_compat: bool) -> list[RuleResult]:
    src, tk, floor = row.cite(), row.toolkit_min, row.mvc_floor
    major = f"{row.version.major}.x"
    below_tk = tk is not None and drv < tk
    below_floor = drv < floor
    fc_ok, fc_why = forward_compat_eligible(gpu, drv)
    fc_used = cuda_compat and fc_ok and below_tk
    out = []
    need = f"driver {drv} vs {row.release} minimum {tk}"
    if tk is None:
        out.append(RuleResult("toolkit-min-driver", WARN, f"{row.release} lists no Linux minimum driver "
                              f"({row.toolkit_min_text!r}); only the {major} floor is checked", src))
    elif not below_tk:
        out.append(RuleResult("toolkit-min-driver", PASS, f"{need}: meets it", src))
    elif fc_used:
        out.append(RuleResult("toolkit-min-driver", WARN, f"{need}: below it, met through cuda-compat", src))
    elif not below_floor:
        out.append(RuleResult("toolkit-min-driver", WARN, f"{need}: below it, runs only through "
                              "minor-version compatibility", src))
    else:
        out.append(RuleResult("toolkit-min-driver", FAIL, f"{need}: below it", src))

    floor_txt = f"CUDA {major} minor-version compatibility needs driver >= {floor}"
    if not below_floor:
        out.append(RuleResult("minor-version-compat", PASS, f"{floor_txt}; {drv} meets it", src))
    elif not below_tk:
        out.append(RuleResult("minor-version-compat", PASS, f"{drv} meets {row.release}'s own minimum; "
                              f"{floor_txt}, which builds of later {major} minors rely on", src))
    elif fc_used:
        out.append(RuleResult("minor-version-compat", WARN, f"{floor_txt}; {drv} is below it, runs only "
                              "through cuda-compat forward compatibility", src))
    else:
        out.append(RuleResult("minor-version-compat", FAIL, f"{floor_txt}; {drv} is below it", src))

    if not below_tk:
        out.append(RuleResult("ptx-jit", PASS, f"driver meets the CUDA {cuda} minimum: PTX JIT and "
                              "newer-driver APIs work", src))
    elif fc_used:
        out.append(RuleResult("ptx-jit", PASS, "cuda-compat supplies the toolkit's user-mode driver and "
                              "PTX JIT compiler", src))
    else:
        effect = (f"PTX built with CUDA {cuda} does not JIT on driver {drv} < {tk} "
                  "(cudaErrorUnsupportedPtxVersion) and APIs needing a newer driver fail "
                  "(cudaErrorCallRequiresNewerDriver)")
        if ptx_jit:
            out.append(RuleResult("ptx-jit", FAIL, f"release JIT-compiles PTX (--ptx-jit): {effect}", src))
        else:
            out.append(RuleResult("ptx-jit", WARN, f"{effect}; declare --ptx-jit if the release relies "
                                  "on PTX JIT", src))

    fc_src = f"{gpu.row.cite()}; {BRANCH_SOURCE}"
    if not below_tk:
        note = " (cuda-compat declared but unused)" if cuda_compat else ""
        out.append(RuleResult("forward-compat", PASS, f"not needed: driver meets the toolkit minimum{note}",
                              fc_src))
    elif fc_used:
        out.append(RuleResult("forward-compat", WARN, f"runs through the cuda-compat package for CUDA {cuda} "
                              f"({fc_why}); the compat package must match the toolkit and the branch "
                              "must stay supported", fc_src))
    elif cuda_compat:
        tail = ("; the driver is also below the floor" if below_floor else "; runs through minor-version "
                "compatibility instead (compat libraries on unsupported hardware fail with CUDA error 804)")
        out.append(RuleResult("forward-compat", FAIL if below_floor else WARN,
                              f"cuda-compat declared but not usable: {fc_why}{tail}", fc_src))
    elif below_floor:
        hint = (f"forward compatibility would apply ({fc_why})" if fc_ok
                else f"forward compatibility would not apply either: {fc_why}")
        out.append(RuleResult("forward-compat", FAIL, f"driver {drv} is below the CUDA {major} floor and the "
                              f"release does not declare cuda-compat (--cuda-compat); {hint}", fc_src))
    else:
        out.append(RuleResult("forward-compat", PASS, "not used: the release runs through minor-version "
                              "compatibility", fc_src))
    return out


def _rule_engine(em: EngineMatch, cuda: CudaVersion) -> RuleResult:
    row = em.row
    builds, exp, src, via = row.builds, row.experimental, row.cite(), ""
    if not builds and not exp and row.torch_minor and row.engine != "pytorch":
        trow = torch_row(row.torch_minor)
        if trow is not None:
            builds, exp = trow.builds, trow.experimental
            via, src = f" (table lists none; builds of its torch {row.torch_minor})", f"{src}; {trow.cite()}"
    label = f"{row.engine} {em.version} (row {row.version_spec!r})"
    listed = ", ".join(map(str, builds)) or "none listed"
    if exp:
        listed += "; experimental " + ", ".join(map(str, exp))
    pin = f"; torch pin: {row.torch_pin}" if row.torch_pin else ""
    drv = f"; table driver note: {row.implied_driver}" if row.implied_driver else ""
    detail = f"builds: {listed}{via}{pin}{drv}"
    if any(b.matches(cuda) for b in builds):
        return RuleResult("engine-build", PASS, f"CUDA {cuda} is a published build of {label}; {detail}", src)
    if any(b.matches(cuda) for b in exp):
        return RuleResult("engine-build", WARN, f"CUDA {cuda} is only an experimental build of {label}; "
                          f"{detail}", src)
    if cuda.major in row.dropped_majors:
        return RuleResult("engine-build", FAIL, f"{label} dropped CUDA {cuda.major}.x; {detail}", src)
    if not builds and not exp:
        return RuleResult("engine-build", WARN, f"the table lists no CUDA builds for {label}: CUDA {cuda} "
                          f"cannot be confirmed; {detail}", src)
    if row.builds_partial:
        return RuleResult("engine-build", WARN, f"CUDA {cuda} is not among the builds listed for {label}, "
                          f"but that list only names changes; {detail}", src)
    if cuda.major in {b.major for b in builds + exp}:
        return RuleResult("engine-build", WARN, f"CUDA {cuda} is not a published build of {label} (a custom "
                          f"build is assumed, verify); {detail}", src)
    return RuleResult("engine-build", FAIL, f"{label} publishes no CUDA {cuda.major}.x build; {detail}", src)


def check(driver: DriverVersion | str, gpu: Gpu | str, cuda: CudaVersion | str,
          engine: EngineMatch | str | None = None, *, ptx_jit: bool = False,
          cuda_compat: bool = False) -> Verdict:
    """Judge one release (CUDA build ``cuda``, optional ``engine``) on ``gpu`` with ``driver``.

    Strings are parsed strictly (``535.104.05``; a DCGM modelName or ``sm_90``/``9.0``; ``12.4``
    or ``12.4.1``; ``vllm==0.6.3``). ``ptx_jit``: the release JIT-compiles PTX or uses APIs that
    need the toolkit's driver; ``cuda_compat``: the release ships the cuda-compat package.
    Returns a :class:`Verdict` with one :class:`RuleResult` per rule applied, each citing its
    data row. Raises :class:`CompatInputError` for malformed or unknown inputs.
    """
    drv = driver if isinstance(driver, DriverVersion) else parse_driver(driver)
    g = gpu if isinstance(gpu, Gpu) else resolve_gpu(gpu)
    cv = cuda if isinstance(cuda, CudaVersion) else parse_cuda(cuda)
    em = engine if isinstance(engine, EngineMatch) or engine is None else resolve_engine(engine)
    row = lookup_cuda(cv)
    rules = [_rule_gpu_arch(g, cv), check_gpu_driver(g, drv)]
    rules += _driver_rules(drv, g, cv, row, ptx_jit, cuda_compat)
    if em is not None:
        rules.append(_rule_engine(em, cv))
    provisional = [r.cite() for r in (row, g.row, em.row if em else None) if r is not None and r.provisional]
    if provisional:
        rules.append(RuleResult("data-provenance", WARN, f"{len(provisional)} row(s) used are third-party, "
                                "unverified or approximate in the reference data: treat as provisional",
                                "; ".join(provisional)))
    inputs: dict[str, object] = {
        "driver": str(drv), "gpu": g.given, "gpu_resolved": g.describe(), "cuda": str(cv),
        "cuda_release": row.release, "engine": em.given if em else None, "ptx_jit": ptx_jit,
        "cuda_compat": cuda_compat,
    }
    return Verdict.from_rules(rules, inputs)
