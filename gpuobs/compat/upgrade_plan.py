"""Driver upgrade planning: batches, per-batch gates, and the compatibility of every release.

:func:`load_inventory` reads the fleet (YAML or JSON); :func:`plan_driver_upgrade` orders the
nodes below the target driver into a canary batch and then batches of at most
``max_unavailable`` nodes, gives each batch its gates (drain, upgrade, health check, uncordon;
plus a soak on the canary), and re-runs the compatibility gate (``gpuobs.compat.gate.check``)
for every release on every node being upgraded, before and after. The plan is blocked (exit 1)
when any release, or any GPU, would be incompatible with the target driver.

Inventory format (keys as dcgm-exporter labels them are accepted too: ``Hostname``,
``DCGM_FI_DRIVER_VERSION``)::

    releases:                      # optional catalogue, referenced by name from nodes
      chat: {cuda: "12.4", engine: "vllm==0.6.3"}
    nodes:                         # or a bare list of nodes
      - hostname: gpu-a-01
        modelName: NVIDIA H100 80GB HBM3
        driver: 550.54.15
        releases: [chat, {name: trainer, cuda: "12.1", engine: "pytorch==2.5", ptx_jit: true}]

A release takes ``cuda`` (required), ``engine``, ``ptx_jit`` and ``cuda_compat`` (booleans).
Version scalars keep their spelling (``12.10`` is not read as the float 12.1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpuobs.compat.gate import (
    DRIVER_BRANCHES,
    FAIL,
    INCOMPATIBLE,
    EngineMatch,
    RuleResult,
    Verdict,
    check,
    check_gpu_driver,
    resolve_engine,
)
from gpuobs.reference.compat import (
    CompatInputError,
    CudaVersion,
    DriverVersion,
    Gpu,
    lookup_cuda,
    parse_cuda,
    parse_driver,
    resolve_gpu,
)

NODE_KEYS = {"hostname": ("hostname", "Hostname"), "modelName": ("modelName", "gpu"),
             "driver": ("driver", "DCGM_FI_DRIVER_VERSION"), "releases": ("releases",)}
RELEASE_KEYS = ("name", "cuda", "engine", "ptx_jit", "cuda_compat")
INVENTORY_ACCEPTED = ("a YAML/JSON mapping with 'nodes' (list of {hostname, modelName, driver, releases}) and "
                      "optional 'releases' {name: {cuda, engine, ptx_jit, cuda_compat}}, or a bare list of nodes")


@dataclass(frozen=True)
class ReleaseSpec:
    """A release running on a node: its CUDA build, optional engine and declared needs."""

    name: str
    cuda: CudaVersion
    engine: EngineMatch | None = None
    ptx_jit: bool = False
    cuda_compat: bool = False

    def describe(self) -> str:
        """``"chat (CUDA 12.4, vllm==0.6.3)"``."""
        extra = "".join(f", {x}" for x in (self.engine.given if self.engine else None,
                                            "ptx-jit" if self.ptx_jit else None,
                                            "cuda-compat" if self.cuda_compat else None) if x)
        return f"{self.name} (CUDA {self.cuda}{extra})"


@dataclass(frozen=True)
class Node:
    """An inventory node: ``hostname``, resolved ``gpu``, current ``driver``, ``releases``."""

    hostname: str
    gpu: Gpu
    driver: DriverVersion
    releases: tuple[ReleaseSpec, ...]


class _VersionKeepingLoader(yaml.SafeLoader):
    """SafeLoader that keeps float-looking scalars as their text (``12.10`` stays "12.10")."""


_VersionKeepingLoader.add_constructor("tag:yaml.org,2002:float", lambda loader, node: loader.construct_scalar(node))


def _flag(value: object, where: str) -> bool:
    if isinstance(value, bool):
        return value
    raise CompatInputError(where, value, "not a boolean", "true or false")


def _release(raw: object, where: str, catalogue: dict[str, ReleaseSpec], default_name: str) -> ReleaseSpec:
    if isinstance(raw, str):
        if raw not in catalogue:
            known = ", ".join(catalogue) or "(catalogue is empty)"
            raise CompatInputError(where, raw, "no such release in the inventory's 'releases' catalogue",
                                   f"one of {known}, or an inline mapping")
        return catalogue[raw]
    if not isinstance(raw, dict):
        raise CompatInputError(where, raw, "not a release",
                               "a catalogue name or a mapping with " + ", ".join(RELEASE_KEYS))
    unknown = [k for k in raw if k not in RELEASE_KEYS]
    if unknown:
        raise CompatInputError(f"{where}.{unknown[0]}", raw[unknown[0]], "unknown key", ", ".join(RELEASE_KEYS))
    if "cuda" not in raw:
        raise CompatInputError(f"{where}.cuda", None, "missing", "a CUDA version such as '12.4'")
    cuda = parse_cuda(raw["cuda"], f"{where}.cuda")
    lookup_cuda(cuda, f"{where}.cuda")
    engine = resolve_engine(raw["engine"], f"{where}.engine") if raw.get("engine") is not None else None
    name = str(raw.get("name") or default_name)
    return ReleaseSpec(name, cuda, engine, _flag(raw.get("ptx_jit", False), f"{where}.ptx_jit"),
                       _flag(raw.get("cuda_compat", False), f"{where}.cuda_compat"))


def parse_inventory(doc: object, origin: str = "--inventory") -> list[Node]:
    """Validate an inventory document (already loaded) into :class:`Node` objects.

    Raises :class:`CompatInputError` naming the offending key path (``nodes[2].driver``), for
    unknown keys, missing fields, malformed versions, unknown GPUs/engines and duplicate hosts.
    """
    catalogue: dict[str, ReleaseSpec] = {}
    if isinstance(doc, dict):
        unknown = [k for k in doc if k not in ("nodes", "releases")]
        if unknown:
            raise CompatInputError(f"{origin} key", unknown[0], "unknown top-level key", INVENTORY_ACCEPTED)
        rel = doc.get("releases") or {}
        if not isinstance(rel, dict):
            raise CompatInputError("releases", rel, "not a mapping", "{name: {cuda, engine, ...}}")
        for name, spec in rel.items():
            if not isinstance(spec, dict):
                raise CompatInputError(f"releases.{name}", spec, "not a mapping", ", ".join(RELEASE_KEYS))
            catalogue[str(name)] = _release({"name": name, **spec}, f"releases.{name}", {}, str(name))
        nodes_raw = doc.get("nodes")
    else:
        nodes_raw = doc
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise CompatInputError(f"{origin} nodes", nodes_raw, "no nodes listed", INVENTORY_ACCEPTED)
    nodes: list[Node] = []
    for i, raw in enumerate(nodes_raw):
        where = f"nodes[{i}]"
        if not isinstance(raw, dict):
            raise CompatInputError(where, raw, "not a mapping", "{hostname, modelName, driver, releases}")
        aliases = {alias: key for key, names in NODE_KEYS.items() for alias in names}
        unknown = [k for k in raw if k not in aliases]
        if unknown:
            raise CompatInputError(f"{where}.{unknown[0]}", raw[unknown[0]], "unknown key",
                                   ", ".join(a for names in NODE_KEYS.values() for a in names))
        vals = {aliases[k]: v for k, v in raw.items()}
        for key in ("hostname", "modelName", "driver"):
            if vals.get(key) in (None, ""):
                raise CompatInputError(f"{where}.{key}", vals.get(key), "missing", " / ".join(NODE_KEYS[key]))
        host = str(vals["hostname"])
        if any(n.hostname == host for n in nodes):
            raise CompatInputError(f"{where}.hostname", host, "duplicate hostname", "unique hostnames")
        rels = vals.get("releases") or []
        if not isinstance(rels, list):
            raise CompatInputError(f"{where}.releases", rels, "not a list", "a list of names or mappings")
        specs = tuple(_release(r, f"{where}.releases[{j}]", catalogue, f"{host}-release-{j}")
                      for j, r in enumerate(rels))
        nodes.append(Node(host, resolve_gpu(vals["modelName"], f"{where}.modelName"),
                          parse_driver(vals["driver"], f"{where}.driver"), specs))
    return nodes


def load_inventory(path: str | Path) -> list[Node]:
    """Read and validate an inventory file (``.json`` as JSON, anything else as YAML).

    Raises :class:`CompatInputError` when the file cannot be read or parsed, or is invalid.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise CompatInputError("--inventory", str(path), f"cannot read file ({err.strerror or err})",
                               "a readable YAML or JSON file") from None
    try:
        doc = (json.loads(text, parse_float=str) if p.suffix.lower() == ".json"
               else yaml.load(text, Loader=_VersionKeepingLoader))  # noqa: S506 - a SafeLoader subclass
    except (ValueError, yaml.YAMLError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        kind = "JSON" if p.suffix.lower() == ".json" else "YAML"
        raise CompatInputError("--inventory", str(path), f"not valid {kind} ({first})", INVENTORY_ACCEPTED) from None
    return parse_inventory(doc)


@dataclass(frozen=True)
class Gate:
    """One step of a batch: ``gate`` (drain | upgrade | health-check | soak | uncordon), ``action``."""

    gate: str
    action: str


@dataclass(frozen=True)
class Batch:
    """Nodes upgraded together (``index`` 0 is the canary) and the gates they pass in order."""

    index: int
    canary: bool
    hosts: tuple[str, ...]
    gates: tuple[Gate, ...]


@dataclass(frozen=True)
class ReleaseCheck:
    """A release on a host judged on the current (``before``) and the target (``after``) driver."""

    hostname: str
    release: ReleaseSpec
    before: Verdict
    after: Verdict

    @property
    def change(self) -> str:
        """``stays compatible`` | ``becomes incompatible`` | ``already incompatible`` | ``fixed``."""
        was, now = self.before.verdict == INCOMPATIBLE, self.after.verdict == INCOMPATIBLE
        return {(False, False): "stays compatible", (False, True): "becomes incompatible",
                (True, True): "already incompatible", (True, False): "fixed"}[(was, now)]


@dataclass
class UpgradePlan:
    """The plan: ``target`` driver, ``batches`` in order, ``skipped`` (host, reason), release
    ``checks`` and per-node GPU support on the target (``gpu_checks``: host -> rule result)."""

    target: DriverVersion
    max_unavailable: int
    batches: list[Batch] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    checks: list[ReleaseCheck] = field(default_factory=list)
    gpu_checks: dict[str, RuleResult] = field(default_factory=dict)

    @property
    def blockers(self) -> list[str]:
        """One line per GPU or release that would be incompatible on the target driver."""
        out = [f"{h}: GPU {r.message}" for h, r in self.gpu_checks.items() if r.status == FAIL]
        out += [f"{c.hostname}: {c.release.describe()} {c.change} (failed: {', '.join(c.after.failed())})"
                for c in self.checks if c.after.verdict == INCOMPATIBLE]
        return out

    @property
    def exit_code(self) -> int:
        """1 if anything would be incompatible on the target driver, else 0."""
        return 1 if self.blockers else 0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form: target, batches (hosts, gates), skipped, gpu_checks, checks, blockers."""
        return {
            "target": str(self.target), "max_unavailable": self.max_unavailable,
            "result": "BLOCKED" if self.blockers else "OK", "exit_code": self.exit_code,
            "batches": [{"index": b.index, "canary": b.canary, "hosts": list(b.hosts),
                         "gates": [{"gate": g.gate, "action": g.action} for g in b.gates]} for b in self.batches],
            "skipped": [{"hostname": h, "reason": why} for h, why in self.skipped],
            "gpu_checks": [{"hostname": h, **r.to_dict()} for h, r in self.gpu_checks.items()],
            "checks": [{"hostname": c.hostname, "release": c.release.name, "release_detail": c.release.describe(),
                        "change": c.change, "before": c.before.to_dict(), "after": c.after.to_dict()}
                       for c in self.checks],
            "blockers": self.blockers,
        }


def _gates(hosts: tuple[str, ...], target: DriverVersion, canary: bool, max_unavailable: int) -> tuple[Gate, ...]:
    names = ", ".join(hosts)
    branch = DRIVER_BRANCHES.get(target.branch)
    label = f"R{target.branch}" + (f" {branch[0]}" if branch else "")
    gates = [
        Gate("drain", f"cordon {names} and drain their workloads (at most {max_unavailable} node(s) unavailable)"),
        Gate("upgrade", f"install driver {target} ({label}) on {names} and reload the kernel module or reboot"),
        Gate("health-check", f"on {names}: nvidia-smi and DCGM_FI_DRIVER_VERSION report {target} on every GPU, "
             "gpuobs_node_expected_gpus GPUs present, dcgmi diag -r 1 passes, no new Xid (DCGM_FI_DEV_XID_ERRORS); "
             "on failure stop the plan and roll back to the previous driver"),
    ]
    if canary:
        gates.append(Gate("soak", f"run the node's releases on {names} and compare against baseline "
                          "(gpuobs canary analyze) before the next batch"))
    gates.append(Gate("uncordon", f"uncordon {names}"))
    return tuple(gates)


def plan_driver_upgrade(nodes: list[Node], target: DriverVersion | str, max_unavailable: int,
                        releases: list[str] | None = None, canary: str | None = None) -> UpgradePlan:
    """Plan upgrading ``nodes`` to ``target`` in batches of at most ``max_unavailable``.

    Nodes already on ``target`` or newer are skipped (never downgraded). The canary batch is
    ``canary`` if given, else the node running the fewest releases (at least one if any node
    runs one; ties by hostname); the rest follow in hostname order. ``releases`` restricts the
    compatibility check to those release names. Raises :class:`CompatInputError` for a bad
    ``max_unavailable``, an unknown release name or an unknown/ineligible canary host.
    """
    tgt = target if isinstance(target, DriverVersion) else parse_driver(target, "--to")
    if isinstance(max_unavailable, bool) or not isinstance(max_unavailable, int) or max_unavailable < 1:
        raise CompatInputError("--max-unavailable", max_unavailable, "not a positive integer", "1, 2, 3 ...")
    known = list(dict.fromkeys(r.name for n in nodes for r in n.releases))
    for name in releases or []:
        if name not in known:
            raise CompatInputError("--release", name, "no node runs a release of that name",
                                   "one of " + (", ".join(known) or "(no releases in the inventory)"))
    plan = UpgradePlan(tgt, max_unavailable)
    todo = []
    for n in nodes:
        if n.driver == tgt:
            plan.skipped.append((n.hostname, f"already on {tgt}"))
        elif n.driver > tgt:
            plan.skipped.append((n.hostname, f"driver {n.driver} is newer than {tgt}; not downgraded"))
        else:
            todo.append(n)
    todo.sort(key=lambda n: n.hostname)
    if canary is not None:
        first = next((n for n in todo if n.hostname == canary), None)
        if first is None:
            raise CompatInputError("--canary", canary, "not a node that this plan upgrades",
                                   "one of " + (", ".join(n.hostname for n in todo) or "(none)"))
    elif todo:
        first = min(todo, key=lambda n: (len(n.releases) == 0, len(n.releases), n.hostname))
    if todo:
        rest = [n for n in todo if n is not first]
        groups = [(first,)] + [tuple(rest[i:i + max_unavailable]) for i in range(0, len(rest), max_unavailable)]
        for i, group in enumerate(groups):
            hosts = tuple(n.hostname for n in group)
            plan.batches.append(Batch(i, i == 0, hosts, _gates(hosts, tgt, i == 0, max_unavailable)))
    for n in todo:
        plan.gpu_checks[n.hostname] = check_gpu_driver(n.gpu, tgt)
        for r in n.releases:
            if releases and r.name not in releases:
                continue
            kwargs = {"engine": r.engine, "ptx_jit": r.ptx_jit, "cuda_compat": r.cuda_compat}
            plan.checks.append(ReleaseCheck(n.hostname, r, check(n.driver, n.gpu, r.cuda, **kwargs),
                                            check(tgt, n.gpu, r.cuda, **kwargs)))
    return plan
