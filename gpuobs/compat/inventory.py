"""Fleet judgement (``gpuobs compat fleet``, the rollout's first gate): judge one catalogue release on every node the fleet's Prometheus knows.

Inventory source: dcgm-exporter's own labels on one per-GPU series (default ``DCGM_FI_DEV_GPU_TEMP``,
in dcgm-exporter's default counter set), keyed by the fleet config's identity label (the one the rules
group by; dcgm-exporter's ``Hostname`` may be a pod name, ``localhost`` or absent, docs/real-fleet.md step 3) and
read through its DCGM selector with one instant query::

    count by (<identity>, modelName, DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP{<selector>})

so each result row is one (node, GPU model, driver) combination and its GPU count. Release source:
the release catalogue (:mod:`gpuobs.reference.releases`; ``engine`` such as ``vllm==0.11.0`` and the
``cuda`` build). Each distinct (model, driver) pair is judged once with
:func:`gpuobs.compat.gate.check`, whose rules cite their data rows.

A node is INCOMPATIBLE when the gate says so, and UNKNOWN when its labels cannot be judged (missing
label, unknown GPU name, malformed driver): the gate fails closed, so the fleet verdict is
INCOMPATIBLE (exit 1) if any node is INCOMPATIBLE or UNKNOWN, or if a node the caller expects
(``hosts``) has no series at all. The rollout controller uses :func:`judge_fleet` as its first gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuobs.compat.gate import (
    COMPATIBLE,
    COMPATIBLE_WITH_WARNINGS,
    FAIL,
    INCOMPATIBLE,
    WARN,
    Verdict,
    check,
)
from gpuobs.promapi.prometheus import PromClient
from gpuobs.reference.compat import CompatInputError
from gpuobs.reference.releases import Release

UNKNOWN = "UNKNOWN"
MODEL_LABEL, DRIVER_LABEL = "modelName", "DCGM_FI_DRIVER_VERSION"
DEFAULT_METRIC = "DCGM_FI_DEV_GPU_TEMP"
#: Why a row without a node cannot be judged.
NO_IDENTITY = ("no node: these GPUs' series lack the identity label, so nodes cannot be told apart (fix the "
               "scrape config's relabelling; `gpuobs doctor` names it)")

@dataclass(frozen=True)
class InventoryRow:
    """One (node, GPU model, driver) combination seen in Prometheus, with its GPU count."""

    hostname: str
    gpu_model: str
    driver: str
    gpus: int


@dataclass
class NodeVerdict:
    """The gate's answer for one inventory row: ``verdict`` is a compat verdict or UNKNOWN."""

    row: InventoryRow
    verdict: str
    failed: list[str] = field(default_factory=list)
    detail: Verdict | None = None
    error: str = ""

    @property
    def warned(self) -> list[str]:
        """Ids of the rules that warned."""
        return [x.rule for x in self.detail.rules if x.status == WARN] if self.detail else []

    def to_dict(self) -> dict[str, object]:
        """JSON-ready row: hostname, gpus, gpu, driver, verdict, failed rules, error, rules."""
        r = self.row
        return {"hostname": r.hostname, "gpus": r.gpus, "gpu": r.gpu_model, "driver": r.driver,
                "verdict": self.verdict, "failed": list(self.failed), "warned": self.warned,
                "error": self.error or None,
                "rules": [x.to_dict() for x in self.detail.rules] if self.detail else []}


@dataclass
class FleetReport:
    """Per-node verdicts of one release; ``missing``: expected hosts with no inventory series."""

    release: Release
    nodes: list[NodeVerdict]
    missing: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """INCOMPATIBLE if any node is INCOMPATIBLE/UNKNOWN or missing, or the inventory is empty."""
        kinds = {n.verdict for n in self.nodes}
        if not self.nodes or self.missing or kinds & {INCOMPATIBLE, UNKNOWN}:
            return INCOMPATIBLE
        return COMPATIBLE_WITH_WARNINGS if COMPATIBLE_WITH_WARNINGS in kinds else COMPATIBLE

    @property
    def exit_code(self) -> int:
        """0 compatible (warnings included), 1 otherwise (:mod:`gpuobs.core.errors`)."""
        return 1 if self.verdict == INCOMPATIBLE else 0

    def blockers(self) -> list[str]:
        """One line per node that blocks the release (used as the rollout's rejection reasons)."""
        out = [f"{n.row.hostname}: {n.verdict} ({', '.join(n.failed) or n.error})"
               for n in self.nodes if n.verdict in (INCOMPATIBLE, UNKNOWN)]
        out += [f"{h}: no {MODEL_LABEL}/{DRIVER_LABEL} series in Prometheus" for h in self.missing]
        if not self.nodes and not self.missing:
            out.append("no node found in the inventory")
        return out

    def to_dict(self) -> dict[str, object]:
        """JSON-ready report."""
        r = self.release
        return {"release": r.version, "engine": r.engine, "cuda": r.cuda, "verdict": self.verdict,
                "exit_code": self.exit_code, "nodes": [n.to_dict() for n in self.nodes], "missing": self.missing}

    def table(self) -> str:
        """Text report: a header, one row per node, then each distinct failing rule with its source."""
        r = self.release
        bad = sum(n.verdict in (INCOMPATIBLE, UNKNOWN) for n in self.nodes) + len(self.missing)
        total = len(self.nodes) + len(self.missing)
        lines = [f"Release {r.version} ({r.engine}, CUDA {r.cuda}): {self.verdict}, "
                 f"{bad} of {total} node row(s) blocking"]
        rows = [("hostname", "gpus", "gpu", "driver", "verdict", "rules")]
        rows += [(n.row.hostname, str(n.row.gpus), n.row.gpu_model or "-", n.row.driver or "-", n.verdict,
                  ("fail: " + ", ".join(n.failed)) if n.failed else (n.error and "see below")
                  or ("warn: " + ", ".join(n.warned) if n.warned else "-")) for n in self.nodes]
        rows += [(h, "0", "-", "-", "MISSING", "no inventory series") for h in self.missing]
        widths = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in rows]
        seen: set[str] = set()
        for n in self.nodes:
            notes = [f"{x.rule}: {x.message} [source: {x.source}]" for x in (n.detail.rules if n.detail else ())
                     if x.status == FAIL] + ([n.error] if n.error else [])
            for note in notes:
                if note not in seen:
                    seen.add(note)
                    lines.append(f"  {n.row.gpu_model or '?'} / driver {n.row.driver or '?'}: {note}")
        return "\n".join(lines)


def inventory(client: PromClient, selector: str, identity_label: str, metric: str = DEFAULT_METRIC) -> list[InventoryRow]:
    """Read the (node, modelName, driver) inventory from Prometheus, sorted by node: ``selector`` and
    ``identity_label`` are the fleet config's (:class:`gpuobs.core.fleet.FleetConfig`), ``hostname`` of a
    row is the node's identity label value.

    Raises :class:`~gpuobs.promapi.prometheus.PrometheusError` subclasses when the query fails.
    Label values missing on a series come back as empty strings.
    """
    q = f"count by ({identity_label}, {MODEL_LABEL}, {DRIVER_LABEL}) ({metric}{{{selector}}})"
    res = client.query(q)
    rows = [InventoryRow(s.labels.get(identity_label, ""), s.labels.get(MODEL_LABEL, ""),
                         s.labels.get(DRIVER_LABEL, ""), int(s.value)) for s in res.samples]
    return sorted(rows, key=lambda r: (r.hostname, r.gpu_model, r.driver))


def judge_fleet(rows: list[InventoryRow], release: Release, hosts: list[str] | None = None, *,
                ptx_jit: bool = False, cuda_compat: bool = False) -> FleetReport:
    """Judge ``release`` on every inventory row (restricted to ``hosts`` when given).

    Each (model, driver) pair is checked once. Rows whose labels the gate cannot parse are UNKNOWN,
    never an exception, and so is a row without a node (its series lack the identity label: every
    unlabelled node would fold into it, and a fleet that cannot be told apart cannot be judged).
    ``hosts`` absent from ``rows`` are listed in ``missing``.
    """
    if hosts is not None:
        wanted = set(hosts)
        rows = [r for r in rows if r.hostname in wanted]
    cache: dict[tuple[str, str], NodeVerdict] = {}
    out = []
    for row in rows:
        if not row.hostname:
            out.append(NodeVerdict(row, UNKNOWN, [], None, NO_IDENTITY))
            continue
        key = (row.gpu_model, row.driver)
        if key not in cache:
            try:
                if not row.gpu_model or not row.driver:
                    raise CompatInputError(MODEL_LABEL if not row.gpu_model else DRIVER_LABEL, "", "label missing",
                                           "dcgm-exporter series carrying modelName and DCGM_FI_DRIVER_VERSION")
                v = check(row.driver, row.gpu_model, release.cuda, release.engine, ptx_jit=ptx_jit,
                          cuda_compat=cuda_compat)
                cache[key] = NodeVerdict(row, v.verdict, v.failed(), v)
            except CompatInputError as err:
                cache[key] = NodeVerdict(row, UNKNOWN, [], None, str(err))
        c = cache[key]
        out.append(NodeVerdict(row, c.verdict, list(c.failed), c.detail, c.error))
    missing = sorted(set(hosts) - {r.hostname for r in rows}) if hosts is not None else []
    return FleetReport(release, out, missing)
