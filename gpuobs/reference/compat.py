"""Reference data for the compatibility gate: strict version parsing and the three CSV tables.

The tables in ``gpuobs/canary/data/`` are verbatim copies of the project's shared data; each row
keeps its ``source`` column so that a verdict can cite it:

* ``cuda_driver_min.csv``: CUDA toolkit release -> minimum Linux driver (NVIDIA CUDA release
  notes, Table 3) and the minor-version-compatibility floor of its major.
* ``gpu_compute_capability.csv``: GPU products -> architecture, compute capability, first/last
  CUDA toolkit, driver branch limits, data-center class (NVIDIA architecture matrix).
* ``engine_requirements.csv``: PyTorch / vLLM / TensorRT-LLM releases -> CUDA builds, torch pin.

Here: versions, parsed rows, :func:`lookup_cuda` and :func:`resolve_gpu`. Engine matching and
the rules live in ``gpuobs.compat.gate``. Bad input raises :class:`CompatInputError`.
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass, field
from importlib import resources

from gpuobs.core.errors import InputError

DATA_PACKAGE = "gpuobs.reference"
CUDA_CSV = "cuda_driver_min.csv"
GPU_CSV = "gpu_compute_capability.csv"
ENGINE_CSV = "engine_requirements.csv"
DRIVER_ACCEPTED = "MAJOR.MINOR[.PATCH] Linux driver version, e.g. 535.104.05, 580.95.05, 570.26"
CUDA_ACCEPTED = "MAJOR.MINOR[.PATCH] CUDA toolkit version, e.g. 12.4 or 12.4.1"
GPU_EXAMPLES = ("'NVIDIA H100 80GB HBM3'", "'NVIDIA A100-SXM4-80GB'", "'Tesla V100-SXM2-32GB'",
                "'NVIDIA B200'", "'NVIDIA L4'", "sm_90", "9.0", "Hopper")

#: Words in a row's cells that mark it provisional (gpuobs/reference/data/README.md: the 13.3/13.4 rows are
#: third-party copies, Orin is unverified, vLLM torch map and TensorRT-LLM rows partly approximate).
_PROVISIONAL_WORDS = ("third-party", "unverified", "not verified", "approximate", "verify against")
_VENDOR_WORDS = ("NVIDIA", "TESLA", "GEFORCE")


class CompatInputError(InputError):
    """Bad input: ``field`` (flag or inventory key such as ``nodes[2].modelName``), ``value`` as
    given, ``problem`` and ``accepted``; ``str(err)`` is one line for stderr."""

    def __init__(self, field: str, value: object, problem: str, accepted: str) -> None:
        self.field, self.value, self.problem, self.accepted = field, value, problem, accepted
        super().__init__(f"invalid {field} {value!r}: {problem}; accepted: {accepted}")


def is_provisional(*texts: str) -> bool:
    """True if any of ``texts`` marks its row as third-party, unverified or approximate."""
    joined = " ".join(texts).lower()
    return any(word in joined for word in _PROVISIONAL_WORDS)


@dataclass(frozen=True, order=True)
class DriverVersion:
    """A Linux driver version such as ``535.104.05``: ``parts`` = (branch, minor, patch), a
    missing patch read as 0 (``570.26`` == ``570.26.0``), ordered numerically; ``text`` as given."""

    parts: tuple[int, int, int]
    text: str = field(compare=False)

    @property
    def branch(self) -> int:
        """The branch number: 535 for ``535.104.05`` (branch R535)."""
        return self.parts[0]

    def __str__(self) -> str:
        return self.text


def parse_driver(text: object, field_name: str = "--driver") -> DriverVersion:
    """Parse a driver version strictly: a 3-digit branch and 1 or 2 more numeric parts.

    Raises :class:`CompatInputError` naming ``field_name`` otherwise (``535``, ``r535``,
    ``535.104.05.1``, ``535.104.x``).
    """
    raw = "" if text is None else str(text).strip()
    m = re.fullmatch(r"(\d{3})\.(\d{1,3})(?:\.(\d{1,3}))?", raw)
    if not m:
        raise CompatInputError(field_name, text, "not a driver version", DRIVER_ACCEPTED)
    return DriverVersion((int(m[1]), int(m[2]), int(m[3] or 0)), raw)


def table_driver(text: str) -> DriverVersion | None:
    """The first driver version in a prose table cell (``>=570.26``, ``580`` -> 580.0.0,
    ``... >=616.00 ...``), or None; lenient where :func:`parse_driver` is strict."""
    m = re.search(r">=\s*(\d{3}(?:\.\d{1,3}){0,2})", text) or re.search(r"\b(\d{3}(?:\.\d{1,3}){0,2})\b", text)
    if not m:
        return None
    nums = [int(p) for p in m[1].split(".")] + [0, 0]
    return DriverVersion((nums[0], nums[1], nums[2]), m[1])


@dataclass(frozen=True)
class CudaVersion:
    """A CUDA toolkit version; ``patch`` None when not given. ``key`` reads a missing patch as 0
    (``12.4`` is the 12.4.0 GA release)."""

    major: int
    minor: int
    patch: int | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        """``(major, minor, patch or 0)``."""
        return (self.major, self.minor, self.patch or 0)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}" + ("" if self.patch is None else f".{self.patch}")


def parse_cuda(text: object, field_name: str = "--cuda") -> CudaVersion:
    """Parse a CUDA version strictly (``12.4``, ``12.4.1``; not ``12``, ``cu124``, ``12.4.x``).

    Raises :class:`CompatInputError` naming ``field_name``.
    """
    raw = "" if text is None else str(text).strip()
    m = re.fullmatch(r"(\d{1,2})\.(\d{1,2})(?:\.(\d{1,3}))?", raw)
    if not m:
        raise CompatInputError(field_name, text, "not a CUDA version", CUDA_ACCEPTED)
    return CudaVersion(int(m[1]), int(m[2]), None if m[3] is None else int(m[3]))


def read_rows(name: str) -> list[dict[str, str]]:
    """Rows of ``gpuobs/canary/data/<name>`` as dicts of stripped strings.

    Raises FileNotFoundError if the package data is missing (a packaging error, not user input).
    """
    text = resources.files(DATA_PACKAGE).joinpath("data", name).read_text(encoding="utf-8")
    return [{k: (v or "").strip() for k, v in row.items()} for row in csv.DictReader(text.splitlines())]


@dataclass(frozen=True)
class CudaRelease:
    """A ``cuda_driver_min.csv`` row. ``version.patch`` is None for a row covering a whole minor
    (``13.4``); ``toolkit_min`` the Linux x86_64 minimum driver (None if the cell names none);
    ``mvc_floor`` the major's minor-version-compatibility floor (13.x 580, 12.x 525.60.13, 11.x
    450.80.02). The ``minor_compat_linux_max_exclusive`` ceiling never binds: every toolkit
    minimum of a major lies below it, and newer drivers are backward compatible."""

    release: str
    version: CudaVersion
    toolkit_min: DriverVersion | None
    toolkit_min_text: str
    mvc_floor: DriverVersion
    source: str
    provisional: bool

    def cite(self) -> str:
        """``cuda_driver_min.csv [release] source``."""
        return f"{CUDA_CSV} [{self.release}] {self.source}"


@functools.cache
def cuda_releases() -> tuple[CudaRelease, ...]:
    """All ``cuda_driver_min.csv`` rows in file order. ValueError if a row has no floor."""
    out = []
    for row in read_rows(CUDA_CSV):
        floor = table_driver(row["minor_compat_linux_min"])
        if floor is None:  # pragma: no cover - guards a damaged table
            raise ValueError(f"{CUDA_CSV}: row {row['cuda_release']!r} has no minor_compat_linux_min")
        out.append(CudaRelease(
            row["cuda_release"], parse_cuda(row["cuda_version"], f"{CUDA_CSV} cuda_version"),
            table_driver(row["linux_x86_64_toolkit_driver_min"]), row["linux_x86_64_toolkit_driver_min"],
            floor, row["source"], is_provisional(row["notes"], row["source"], row["cuda_release"])))
    return tuple(out)


def lookup_cuda(version: CudaVersion, field_name: str = "--cuda") -> CudaRelease:
    """The row for ``version``: ``12.4`` is the GA release 12.4.0, ``12.4.1`` must match exactly,
    a patch-less row (``13.4``) covers its whole minor. Raises :class:`CompatInputError` listing
    the known versions otherwise (never rounds to a neighbour)."""
    rows = cuda_releases()
    minor = (version.major, version.minor)
    for row in rows:
        if row.version.patch is not None and row.version.key == version.key:
            return row
    for row in rows:
        if row.version.patch is None and (row.version.major, row.version.minor) == minor:
            return row
    same = [str(r.version) for r in rows if (r.version.major, r.version.minor) == minor]
    known = same or list(dict.fromkeys(f"{r.version.major}.{r.version.minor}" for r in rows))
    raise CompatInputError(field_name, str(version), f"no CUDA {version} release in {CUDA_CSV}",
                           "one of " + ", ".join(known))


@dataclass(frozen=True)
class GpuRow:
    """A ``gpu_compute_capability.csv`` row with its prose parsed. ``models``: product names from
    ``gpu_examples`` plus parenthesised aliases (``GB10``); ``first_cuda``: (first toolkit, sm
    target it applies to or None) pairs; ``last_cuda_major``: last toolkit major (Volta 12) or
    None; ``last_branch``/``min_branch``: driver branch limits (R580 last for Volta, R570+ for
    Blackwell) or None; ``data_center``: "all", "none" or "some" (``dc_models`` named)."""

    examples: str
    architecture: str
    models: tuple[str, ...]
    compute_capabilities: tuple[str, ...]
    sm_targets: tuple[str, ...]
    first_cuda: tuple[tuple[CudaVersion, str | None], ...]
    last_cuda_major: int | None
    last_branch: int | None
    min_branch: int | None
    jetpack: bool
    data_center: str
    dc_models: tuple[str, ...]
    notes: str
    source: str
    provisional: bool

    def cite(self) -> str:
        """``gpu_compute_capability.csv [gpu_examples] source``."""
        return f"{GPU_CSV} [{self.examples}] {self.source}"


def _parse_gpu_row(row: dict[str, str]) -> GpuRow:
    models = []
    for token in row["gpu_examples"].split(" / "):
        paren = re.search(r"\(([^)]*)\)", token)
        models.append(re.sub(r"\([^)]*\)", "", token).strip())
        if paren and "/" not in paren[1]:
            models.append(paren[1].strip())
    first = []
    for seg in row["first_cuda_toolkit"].split(";"):
        ver, tag = re.search(r"(\d+)\.(\d+)", seg), re.search(r"sm_\w+", seg)
        if ver:
            first.append((CudaVersion(int(ver[1]), int(ver[2])), tag[0] if tag else None))
    last = re.fullmatch(r"(\d+)\.x", row["last_cuda_toolkit"])
    branch = row["last_driver_branch"]
    last_branch, min_branch = re.fullmatch(r"R(\d{3})", branch), re.search(r"R(\d{3})\+", branch)
    dc_paren = re.search(r"\(([^)]*)\)", row["data_center_class"])
    if not row["data_center_class"].lower().startswith("yes"):
        data_center, dc_models = "none", ()
    elif dc_paren:
        data_center, dc_models = "some", tuple(p.strip() for p in dc_paren[1].split("/"))
    else:
        data_center, dc_models = "all", ()
    return GpuRow(
        row["gpu_examples"], row["architecture"], tuple(models),
        tuple(re.findall(r"\d+\.\d+", row["compute_capability"])),
        tuple(re.findall(r"sm_\d+[a-z]?", row["sm_targets"])), tuple(first),
        int(last[1]) if last else None, int(last_branch[1]) if last_branch else None,
        int(min_branch[1]) if min_branch else None, branch.lower() == "jetpack", data_center, dc_models,
        row["notes"], row["source"], is_provisional(row["notes"], row["source"]))


@functools.cache
def gpu_rows() -> tuple[GpuRow, ...]:
    """All ``gpu_compute_capability.csv`` rows, parsed, in file order."""
    return tuple(_parse_gpu_row(row) for row in read_rows(GPU_CSV))


def _norm(text: str) -> str:
    """Upper-case, separators to single spaces, leading NVIDIA/Tesla/GeForce dropped."""
    words = re.sub(r"[\s_,/-]+", " ", text.upper()).split()
    while words and words[0] in _VENDOR_WORDS:
        words.pop(0)
    return " ".join(words)


@dataclass(frozen=True)
class Gpu:
    """A ``--gpu`` input resolved to its row: ``given`` as typed, ``cc`` the compute capability
    named or the row's (``9.0``), ``sm`` the sm target named (``sm_90a``) or None,
    ``data_center`` True/False, or None when an sm/cc/architecture name on a row mixing
    data-center and workstation parts cannot tell."""

    given: str
    row: GpuRow
    cc: str
    sm: str | None
    data_center: bool | None

    def describe(self) -> str:
        """``"<given> -> <architecture>, compute capability <cc>"``."""
        return f"{self.given} -> {self.row.architecture}, compute capability {self.cc}"

    @property
    def first_cuda(self) -> CudaVersion | None:
        """First toolkit that targets this GPU (the one for its named sm target if listed)."""
        tagged = [v for v, tag in self.row.first_cuda if tag is not None and tag == self.sm]
        return (tagged or [v for v, _ in self.row.first_cuda] or [None])[0]


def _dc_flag(row: GpuRow, norm_name: str | None) -> bool | None:
    if row.data_center != "some":
        return row.data_center == "all"
    if norm_name is None:
        return None
    return any(set(_norm(n).split()) <= set(norm_name.split()) for n in row.dc_models)


def resolve_gpu(text: object, field_name: str = "--gpu") -> Gpu:
    """Resolve a DCGM ``modelName`` (``NVIDIA H100 80GB HBM3``), an sm target (``sm_90``,
    ``sm_90a``), a compute capability (``9.0``) or an architecture (``Hopper``) to its row.

    Model names match ``gpu_examples`` products as whole leading words, ignoring case, separators
    and a leading NVIDIA/Tesla/GeForce (``A100-SXM4-80GB`` is an A100, ``A10G`` is not an A10);
    the longest match wins. Raises :class:`CompatInputError` listing the accepted forms and
    known models when no row, or more than one, matches.
    """
    raw, rows = ("" if text is None else str(text).strip()), gpu_rows()
    accepted = ("a DCGM modelName, sm_XY, compute capability X.Y or architecture, e.g. " + ", ".join(GPU_EXAMPLES)
                + "; known models: " + ", ".join(n for r in rows for n in r.models))
    sm = re.fullmatch(r"(?i)(?:sm|compute)_?(\d)(\d{1,2})([af]?)", raw)
    cc = re.fullmatch(r"(\d{1,2})\.(\d)", raw)
    if sm or cc:
        major, minor = (sm[1] + sm[2][:-1], sm[2][-1]) if sm else (cc[1], cc[2])
        target = f"sm_{major}{minor}{sm[3].lower()}" if sm else None
        hits = [r for r in rows if (target in r.sm_targets if sm else f"{major}.{minor}" in r.compute_capabilities)]
        if len(hits) == 1:
            return Gpu(raw, hits[0], f"{major}.{minor}", target, _dc_flag(hits[0], None))
        what = f"sm target {target}" if sm else f"compute capability {raw}"
        raise CompatInputError(field_name, text, f"no single GPU row has {what}", accepted)
    q = _norm(raw)
    matches = [(len(_norm(name)), r) for r in rows for name in r.models
               if q and re.match(re.escape(_norm(name)).replace("XX", r"\d\d") + r"(?: |$)", q)]
    best = {id(r): r for n, r in matches if n == max(m for m, _ in matches)}
    if len(best) == 1:
        row = next(iter(best.values()))
        return Gpu(raw, row, "/".join(row.compute_capabilities), None, _dc_flag(row, q))
    arch = [r for r in rows if q and (_norm(re.sub(r"[()]", "", r.architecture)) + " ").startswith(q + " ")]
    if len(arch) == 1 and not matches:
        return Gpu(raw, arch[0], "/".join(arch[0].compute_capabilities), None, _dc_flag(arch[0], None))
    problem = "unknown GPU" if not matches and not arch else "ambiguous GPU name (rows: " + "; ".join(
        r.examples for r in (arch or list(best.values()))) + ")"
    raise CompatInputError(field_name, text, problem, accepted)


@dataclass(frozen=True)
class BuildTag:
    """A CUDA build of an engine: ``cu124`` is (12, 4), a whole major ``cu12x`` is (12, None)."""

    major: int
    minor: int | None

    def matches(self, cuda: CudaVersion) -> bool:
        """True if toolkit ``cuda`` is this build (any patch; any minor for ``cuNNx``)."""
        return cuda.major == self.major and self.minor in (None, cuda.minor)

    def __str__(self) -> str:
        return f"cu{self.major}{'x' if self.minor is None else self.minor}"


def parse_builds(text: str) -> tuple[tuple[BuildTag, ...], frozenset[int], bool]:
    """Parse an engine CUDA-build cell into ``(builds, dropped_majors, partial)``: tags from
    ``cu118``/``cu12x``/``cu13``/``CUDA 13.1``/``12.x``; majors after "drops" (``drops CUDA
    11.x``); ``partial`` if the cell only lists changes ("adds CUDA 13.0")."""
    builds: list[BuildTag] = []
    dropped: set[int] = set()
    for seg in text.split(";"):
        if "drops" in seg.lower():
            dropped.update(int(m) for m in re.findall(r"(\d{2})\.x", seg))
            continue
        for m in re.finditer(r"\bcu(\d{2})(\d|x)?(?![\dx])", seg):
            builds.append(BuildTag(int(m[1]), int(m[2]) if m[2] and m[2] != "x" else None))
        for m in re.finditer(r"CUDA(?: Toolkit)? (\d{2})\.(\d{1,2}|x)\b|\b(\d{2})\.x\b", seg):
            builds.append(BuildTag(int(m[1] or m[3]), int(m[2]) if m[2] and m[2] != "x" else None))
    return tuple(dict.fromkeys(builds)), frozenset(dropped), "adds" in text.lower()


@dataclass(frozen=True)
class EngineRow:
    """An ``engine_requirements.csv`` row. ``version_spec`` is the version cell (``0.9.x``,
    ``<=0.6.3.x``, ``0.10.2-0.11.0``, ``1.2.0rc6``, ``main (snapshot)``); ``builds`` and
    ``experimental`` the parsed CUDA builds; ``torch_minor`` the pinned torch ``X.Y`` (a PyTorch
    row's own version) or None; ``implied_driver`` the driver prose, shown but not enforced (the
    toolkit rules enforce the same minima from cuda_driver_min.csv)."""

    engine: str
    version_spec: str
    builds: tuple[BuildTag, ...]
    experimental: tuple[BuildTag, ...]
    dropped_majors: frozenset[int]
    builds_partial: bool
    torch_pin: str
    torch_minor: str | None
    implied_driver: str
    source: str
    provisional: bool

    def cite(self) -> str:
        """``engine_requirements.csv [engine version] source``."""
        return f"{ENGINE_CSV} [{self.engine} {self.version_spec}] {self.source}"


#: engine_requirements.csv rows that illustrate a rule rather than describe an engine release.
NON_ENGINE_ROWS = frozenset({"ngc-container-example"})


@functools.cache
def engine_rows() -> tuple[EngineRow, ...]:
    """Engine release rows of ``engine_requirements.csv`` in file order (illustrations left out)."""
    out = []
    for row in read_rows(ENGINE_CSV):
        if row["engine"] in NON_ENGINE_ROWS:
            continue
        builds, dropped, partial = parse_builds(row["cuda_builds_stable"])
        pin = re.search(r"\btorch(?:==|\s+)(\d+\.\d+)", row["torch_pin"])
        torch_minor = row["version"] if row["engine"] == "pytorch" else (pin[1] if pin else None)
        out.append(EngineRow(
            row["engine"], row["version"], builds, parse_builds(row["cuda_builds_experimental"])[0], dropped,
            partial, row["torch_pin"], torch_minor, row["implied_min_linux_driver"], row["source"],
            is_provisional(row["notes"], row["source"], row["cuda_builds_stable"])))
    return tuple(out)


def torch_row(minor: str) -> EngineRow | None:
    """The ``pytorch`` row for torch ``minor`` (``"2.7"``), or None."""
    return next((r for r in engine_rows() if r.engine == "pytorch" and r.version_spec == minor), None)
