"""The failure drills: which fault to inject where, and which alerts must page or ticket.

Each drill names the node role it runs on, the faults (admin-API bodies) or release deploys that
cause the failure, the alerts that must reach the pager (with their receiver), and the alerts that
may fire as consequences only if Alertmanager inhibits them (so they never notify). Anything else
that starts firing during the drill is a false alert. ``LANES`` groups drills that share a node so
``gpuobs drill all`` can run lanes in parallel on different nodes; ``FINAL`` runs alone afterwards
because it touches the whole serving fleet. :data:`PANELS` names, per drill, the metrics its fault
moves, which the drill report plots (:mod:`gpuobs.reports.drill`): one file owns everything a drill is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from gpuobs.core.fleet import DEFAULT_DCGM_SELECTOR as DCGM_SELECTOR
from gpuobs.core.fleet import DEFAULT_VLLM_SELECTOR as VLLM_SELECTOR
from gpuobs.mixin.placement import GLOBAL_JOB
from gpuobs.reference import xid as xidcat


@dataclass(frozen=True)
class Expect:
    """An alert that must fire and reach ``receiver`` (page|ticket); ``scoped``: on the drill's node."""

    alertname: str
    receiver: str
    scoped: bool = True
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DrillSpec:
    """One drill. ``faults`` are admin-API bodies for the drill's node; ``deploy`` a release version
    rolled onto every serving node (and rolled back on clear). Deadlines are for the drill profile;
    the default profile multiplies them (its ``for:`` durations are longer)."""

    name: str
    role: str
    slot: int
    expect: tuple[Expect, ...]
    faults: tuple[dict, ...] = ()
    deploy: str | None = None
    allowed: frozenset[str] = frozenset()
    fire_deadline_s: float = 150.0
    resolve_deadline_s: float = 240.0
    about: str = ""
    #: A drill that burns an SLO's error budget: (SLO name in prometheus/slo.yaml, error ratio its release
    #: adds). On the default profile its fire deadline follows from that SLO's burn-rate page rules
    #: (:func:`slo_fire_deadline`), not from ``fire_deadline_s`` x 6.
    slo_burn: tuple[str, float] | None = None
    #: A stack member (an HA topology component, e.g. ``vmalert``) killed with SIGKILL once every expected
    #: alert has notified, and restarted ``outage_s`` seconds later while the fault persists: the incident
    #: must stay one incident (no second notification episode, no re-opening), and ``outage_expect`` (the
    #: alert that says the member is gone) must notify during the outage. Runs only on the topology named
    #: by ``topology`` (None: every topology).
    outage: str | None = None
    outage_s: float = 60.0
    outage_expect: tuple[Expect, ...] = ()
    topology: str | None = None


DRILLS: dict[str, DrillSpec] = {d.name: d for d in (
    DrillSpec("xid", "serving", 0, (Expect("GpuXidCritical", "page", labels={"gpu": "0", "xid": "48"}),),
              ({"kind": "xid", "gpu": 0, "code": 48},), fire_deadline_s=60,
              about="Xid 48 (double-bit ECC error) on one GPU pages with the Xid runbook"),
    DrillSpec("thermal", "serving", 0, (Expect("GPUThrottling", "ticket", labels={"gpu": "1"}),),
              ({"kind": "thermal", "gpu": 1, "cooling_factor": 3.0},),
              about="failed cooling: temperature past slowdown, clocks throttled, ticket"),
    DrillSpec("gpu-missing", "serving", 0, (Expect("GpuMissing", "page"),),
              ({"kind": "xid", "gpu": 6, "code": 79},), allowed=frozenset({"ServingEngineDown"}),
              # GpuMissing pages 2m (GAP_TOLERANCE) after the GPU's last sample; GpuFallenOffBus at once
              fire_deadline_s=210,
              about="Xid 79: the GPU falls off the bus and vanishes from the page; its engine crashes (inhibited)"),
    DrillSpec("power-brake", "serving", 1, (Expect("GPUThrottling", "ticket", labels={"gpu": "2"}),),
              ({"kind": "power-brake", "gpu": 2},),
              about="external power brake: clocks collapse, power violation accrues, ticket"),
    DrillSpec("ecc-dbe", "serving", 1, (Expect("GpuEccDoubleBitError", "page", labels={"gpu": "3"}),),
              ({"kind": "ecc-dbe", "gpu": 3},),
              allowed=frozenset({"GpuXidCritical", "GpuXidWarning", "GpuRowRemapPending"}),
              about="one uncorrectable ECC error pages once: its Xid 48 joins the DBE's incident, Xid 63 and the pending remap are inhibited"),
    DrillSpec("node-down", "serving", 1, (Expect("GpuExporterDown", "page"),), ({"kind": "down"},),
              allowed=frozenset({"ServingEngineDown"}),
              about="a node stops answering: exactly one page (its engine alert stays quiet while the node is down)"),
    DrillSpec("fragmentation", "serving", 2, (Expect("KVFragmentationRisk", "ticket", labels={"gpu": "4"}),),
              ({"kind": "fragmentation", "gpu": 4, "rate_mib_per_min": 1500.0},),
              allowed=frozenset({"GpuFrameworkOom"}), fire_deadline_s=240,
              about="allocator gap grows with allocated flat: ticket before the OOM"),
    DrillSpec("kv-pressure", "serving", 2, (Expect("ServingKVCachePressure", "ticket"),),
              ({"kind": "kv-pressure", "factor": 2.5},),
              about="long-context surge: KV cache full, preemptions, ticket"),
    DrillSpec("collective-hang", "training", 0, (Expect("TrainingCollectiveHang", "page"),),
              ({"kind": "collective-hang"},), fire_deadline_s=210,
              about="NCCL hang: GPU util ~100 % while SM active, power and steps collapse; page"),
    DrillSpec("straggler", "training", 0, (Expect("TrainingStraggler", "ticket", labels={"gpu": "5"}),),
              ({"kind": "straggler", "gpu": 5, "slowdown": 1.6},), fire_deadline_s=210, resolve_deadline_s=420,
              about="one slow rank: its step time stands out from the job median; ticket"),
    DrillSpec("driver-skew", "serving", 2, (Expect("GpuDriverSkew", "ticket", scoped=False),),
              ({"kind": "driver", "version": "580.95.05"},),
              about="one node on another driver branch: skew in the pool; ticket"),
    DrillSpec("vmalert-outage", "serving", 2, (Expect("GpuDriverSkew", "ticket", scoped=False),),
              ({"kind": "driver", "version": "580.95.05"},), outage="vmalert", outage_s=60.0,
              outage_expect=(Expect("FleetRulesBlind", "ticket", scoped=False),), topology="ha",
              fire_deadline_s=240, resolve_deadline_s=300,
              about="HA only: vmalert killed for 60 s during a fleet-wide incident (driver skew); FleetRulesBlind "
                    "tickets the outage from the shards, the incident stays one incident across vmalert's restart"),
    DrillSpec("slo-burn", "fleet", 0,
              (Expect("ServingErrorBudgetBurn", "page", scoped=False, labels={"slo": "availability", "severity": "critical"}),),
              deploy="1.6.1", fire_deadline_s=240, resolve_deadline_s=360,
              # 1.6.1 adds 3 % errors (gpuobs/exporter/sim/data/behaviour.yaml, checked by tests/drills)
              slo_burn=("availability", 0.03),
              about="a release with +3% errors on every serving node burns the availability budget; page"),
)}

#: Drills grouped by the node they use; lanes run in parallel, drills within a lane in order.
LANES: tuple[tuple[str, ...], ...] = (
    ("xid", "thermal", "gpu-missing"),
    ("power-brake", "ecc-dbe", "node-down"),
    ("fragmentation", "kv-pressure", "driver-skew"),
    ("collective-hang", "straggler"),
)
#: Run alone after the lanes, in order. ``vmalert-outage`` blinds every fleet-wide rule for a minute, so
#: nothing else may run then (it runs on the HA topology only, DrillSpec.topology).
FINAL: tuple[str, ...] = ("slo-burn", "vmalert-outage")


#: What the stack adds between a burn-rate condition holding and the page reaching the pager: a 5 s
#: scrape, the SLI recording rules' and the alert's 5 s evaluations, Alertmanager's 5 s group_wait and the
#: pager (docs/drills.md, "Timing of the stack"), with room to spare.
SLO_PAGE_LATENCY_S = 60.0
#: Margin on the computed time to page: the request rate varies, and rate() extrapolates at the edges.
SLO_DEADLINE_MARGIN = 0.15


@dataclass(frozen=True)
class SloDeadline:
    """The fire deadline of an SLO-burn drill, and how it follows from the rules."""

    deadline_s: float
    time_to_page_s: float
    long_s: int
    short_s: int
    factor: float
    threshold: float
    added_error_ratio: float

    def explain(self) -> str:
        def mins(s: float) -> str:
            return f"{int(s // 60)}m{int(round(s % 60)):02d}s"
        return (f"the {mins(self.long_s)}/{mins(self.short_s)} x{self.factor:g} page condition needs the error ratio over "
                f"{self.threshold:.2%} in both windows: +{self.added_error_ratio:.2%} errors take the long window there "
                f"after {mins(self.time_to_page_s)} ({mins(self.long_s)} x {self.threshold:.2%} / {self.added_error_ratio:.2%}); "
                f"deadline {mins(self.deadline_s)} (+{SLO_DEADLINE_MARGIN:.0%} and {SLO_PAGE_LATENCY_S:.0f} s to the pager, "
                f"never past the long window's turnover, {mins(self.long_s + SLO_PAGE_LATENCY_S)}, after which this "
                "condition can no longer start to hold)")


def slo_fire_deadline(added_error_ratio: float, objective: float, period_s: int) -> SloDeadline:
    """The fire deadline of a drill that adds ``added_error_ratio`` errors to an SLO of ``objective`` with
    an SLO period of ``period_s`` seconds, from the page conditions of the burn-rate rules
    (:func:`gpuobs.mixin.slo_rules.windows`: long AND short window error ratio over factor x budget).

    With the error ratio stepping from the baseline b to b + d at the injection, a window of length W
    holds (d x t + b x W) / W after t <= W seconds, over the threshold T from t = W x (T - b) / d; the
    baseline is taken as 0, an upper bound (the real ~0.02 % only brings the page sooner, as does a stack
    younger than the window). A pair pages when both its windows are over T: at the long window's time,
    the short one being shorter. The earliest paging pair gives the time to page; the deadline adds
    :data:`SLO_DEADLINE_MARGIN` and :data:`SLO_PAGE_LATENCY_S`, capped at that pair's long window (+ the
    latency): once the long window holds only post-injection samples its ratio stops rising, so a page
    that has not come by then cannot come from this pair. Raises ValueError when no page pair can fire
    (d at most every pair's threshold)."""
    from gpuobs.mixin.slo_rules import windows

    budget = 1.0 - objective
    best: SloDeadline | None = None
    for w in windows(period_s):
        threshold = w.factor * budget
        if w.severity != "critical" or added_error_ratio <= threshold:
            continue
        ttp = max(w.long_s, w.short_s) * threshold / added_error_ratio
        deadline = math.ceil(round(min(ttp * (1 + SLO_DEADLINE_MARGIN) + SLO_PAGE_LATENCY_S,
                                        w.long_s + SLO_PAGE_LATENCY_S), 6))  # whole s, no float noise
        cand = SloDeadline(float(deadline), ttp, w.long_s, w.short_s, w.factor, threshold, added_error_ratio)
        if best is None or cand.time_to_page_s < best.time_to_page_s:
            best = cand
    if best is None:
        raise ValueError(f"+{added_error_ratio:.2%} errors never page an SLO of {objective:.3%}: every page "
                         f"threshold is higher ({', '.join(f'{w.factor:g}x' for w in windows(period_s) if w.severity == 'critical')} "
                         "the budget)")
    return best


def stack_slo_deadline(spec: DrillSpec, profile: str) -> SloDeadline | None:
    """:func:`slo_fire_deadline` for ``spec`` on a stack of rule ``profile``, from the repository's
    prometheus/slo.yaml (its period; the drill profile's DRILL_SLO_PERIOD); None for a drill that burns
    no SLO."""
    if spec.slo_burn is None:
        return None
    from gpuobs.core import assets
    from gpuobs.mixin.profile import DRILL_SLO_PERIOD
    from gpuobs.mixin.slo_rules import load_config, parse_period

    name, added = spec.slo_burn
    cfg = load_config(assets.root() / "prometheus" / "slo.yaml")
    objective = next(s["objective"] for s in cfg["slos"] if s["name"] == name)
    period = DRILL_SLO_PERIOD if profile == "drill" else cfg["period"]
    return slo_fire_deadline(added, objective, parse_period(period))


def xid_drill(code: int) -> DrillSpec:
    """The xid drill for another Xid code: catalogue-critical codes page (``GpuXidCritical``), ticket
    codes ticket (``GpuXidWarning``), 79 shows as ``GpuMissing``. Raises ValueError for info-class
    codes, which alert nowhere by design."""
    base = DRILLS["xid"]
    if code == 79:
        return replace(DRILLS["gpu-missing"], name="xid")
    if code in xidcat.critical_codes():
        exp = Expect("GpuXidCritical", "page", labels={"gpu": "0", "xid": str(code)})
    elif code in xidcat.ticket_codes():
        exp = Expect("GpuXidWarning", "ticket", labels={"gpu": "0", "xid": str(code)})
    else:
        raise ValueError(f"Xid {code} is info-class ({xidcat.message(code)}): no alert is expected; choose a "
                         f"critical code ({', '.join(map(str, xidcat.critical_codes()[:8]))}, ...) or a ticket code")
    return replace(base, expect=(exp,), faults=({"kind": "xid", "gpu": 0, "code": code},))


# ---- what each drill's report plots ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Panel:
    """One plot: title, y-axis unit, and ``(legend, expr)`` queries. Exprs are :class:`string.Template`
    text: ``$gpu`` (identity and gpu matchers), ``$host`` (the fleet config's identity label, which the
    scrape config sets; dcgm-exporter's ``Hostname`` may be a pod name or ``localhost``), ``$w`` (rate
    window); a fleet-wide drill substitutes empty selectors. ``pages_with``: the alerts whose page this
    panel shows the cause of (the report puts the panels of the alerts that actually paged first)."""

    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]
    pages_with: frozenset[str] = frozenset()


def _p(title: str, unit: str, *queries: tuple[str, str], pages_with: tuple[str, ...] = ()) -> Panel:
    return Panel(title, unit, tuple(queries), frozenset(pages_with))


_XID = _p("Xids in the exporter's sliding window (DCGM_EXP_XID_ERRORS_COUNT; the DCGM path)", "Xids",
          ("GPU {gpu} xid {xid}", "DCGM_EXP_XID_ERRORS_COUNT{$gpu}"), pages_with=("GpuXidCritical", "GpuXidWarning"))
#: The kernel-log path (logwatch's counter, gpuobs.logwatch.agent): what pages an Xid on a stack whose
#: nodes run logwatch (the default stack; prometheus/rules/gpu-kernel-log.yml).
_KERNEL_XID = _p("Xid lines counted in the kernel log (logwatch: gpuobs_xid_events_total)", "lines since logwatch's state began",
                 ("GPU {gpu} xid {xid}", "gpuobs_xid_events_total{$gpu}"),
                 pages_with=("GpuKernelXidCritical", "GpuKernelXidWarning", "GpuKernelXidRepeated"))
_SM_CLOCK = _p("SM clock", "MHz", ("GPU {gpu}", "DCGM_FI_DEV_SM_CLOCK{$gpu}"))
_POWER = _p("Power draw", "W", ("GPU {gpu}", "DCGM_FI_DEV_POWER_USAGE{$gpu}"))

#: The metrics each drill's fault moves (keyed by drill name, falling back to the fault's kind).
PANELS: dict[str, tuple[Panel, ...]] = {
    "xid": (_KERNEL_XID, _XID, _p("Last Xid seen (DCGM_FI_DEV_XID_ERRORS; never resets)", "Xid code",
                     ("GPU {gpu}", "DCGM_FI_DEV_XID_ERRORS{$gpu}"))),
    "gpu-missing": (
        _p("GPUs reporting vs expected", "GPUs",
           ("reporting", "count(count by (gpu) (DCGM_FI_DEV_GPU_TEMP{$host}))"),
           ("expected", "max(gpuobs_node_expected_gpus{$host})"), pages_with=("GpuMissing",)),
        _p("GPU fallen off the bus per the kernel log (logwatch: gpuobs_gpu_fallen_off_bus)", "0/1",
           ("GPU {gpu}", "gpuobs_gpu_fallen_off_bus{$host}"), pages_with=("GpuFallenOffBus",)),
        _p("Xids in the exporter's window (the GPU's series vanish with it)", "Xids",
           ("GPU {gpu} xid {xid}", "DCGM_EXP_XID_ERRORS_COUNT{$host}")),
        _p("Serving engine scrape health", "up", ("vLLM engine", f'up{{{VLLM_SELECTOR},$host}}'))),
    "thermal": (
        _p("GPU temperature", "degrees C", ("GPU {gpu}", "DCGM_FI_DEV_GPU_TEMP{$gpu}")),
        _SM_CLOCK,
        _p("Fraction of time thermally throttled (rate of DCGM_FI_DEV_THERMAL_VIOLATION / 1e9)", "ratio",
           ("GPU {gpu}", "rate(DCGM_FI_DEV_THERMAL_VIOLATION{$gpu}[$w]) / 1e9")),
        _p("The node's TTFT p50 (vLLM histogram)", "s",
           ("p50", "histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{$host}[$w])))"))),
    "power-brake": (
        _SM_CLOCK, _POWER,
        _p("Fraction of time power-throttled (rate of DCGM_FI_DEV_POWER_VIOLATION / 1e9)", "ratio",
           ("GPU {gpu}", "rate(DCGM_FI_DEV_POWER_VIOLATION{$gpu}[$w]) / 1e9"))),
    "ecc-dbe": (
        _p("Double-bit ECC errors", "errors", ("volatile", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{$gpu}"),
           ("aggregate", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{$gpu}")),
        _p("Remapped rows", "rows", ("uncorrectable", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{$gpu}"),
           ("correctable", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{$gpu}"),
           ("remap failure", "DCGM_FI_DEV_ROW_REMAP_FAILURE{$gpu}")),
        _KERNEL_XID, _XID),
    "fragmentation": (
        _p("PyTorch allocator: reserved vs allocated", "GiB",
           ("reserved", "pytorch_cuda_memory_reserved_bytes{$gpu} / 2^30"),
           ("allocated", "pytorch_cuda_memory_allocated_bytes{$gpu} / 2^30")),
        _p("Fragmentation gap (reserved - allocated)", "GiB",
           ("gap", "(pytorch_cuda_memory_reserved_bytes{$gpu} - pytorch_cuda_memory_allocated_bytes{$gpu}) / 2^30")),
        _p("Allocator retries and OOMs", "per second",
           ("alloc retries", "rate(pytorch_cuda_alloc_retries_total{$gpu}[$w])"),
           ("OOMs", "rate(pytorch_cuda_ooms_total{$gpu}[$w])"))),
    "kv-pressure": (
        _p("KV-cache usage", "ratio", ("usage", "vllm:kv_cache_usage_perc{$host}")),
        _p("Preemptions", "per second", ("preemptions", "sum(rate(vllm:num_preemptions_total{$host}[$w]))")),
        _p("Queue time p50", "s",
           ("p50", "histogram_quantile(0.5, sum by (le) (rate(vllm:request_queue_time_seconds_bucket{$host}[$w])))"))),
    "collective-hang": (
        _p("GPU utilisation vs SM active (why GPU util lies)", "ratio",
           ("GPU_UTIL / 100", "avg(DCGM_FI_DEV_GPU_UTIL{$host}) / 100"),
           ("SM_ACTIVE", "avg(DCGM_FI_PROF_SM_ACTIVE{$host})")),
        _p("Power draw (node average per GPU)", "W", ("power", "avg(DCGM_FI_DEV_POWER_USAGE{$host})")),
        _p("Training step rate", "steps per second", ("steps", "max(rate(training_steps_total{$host}[$w]))"))),
    "straggler": (
        _p("Mean step time per rank", "s",
           ("rank {rank} (GPU {gpu})", "rate(training_step_duration_seconds_sum{$host}[$w]) "
                                       "/ rate(training_step_duration_seconds_count{$host}[$w])")),
        _p("MFU per rank", "ratio", ("rank {rank}", "training_mfu_ratio{$host}"))),
    "driver-skew": (
        _p("Driver versions in the fleet", "versions",
           ("versions", "count(count by (DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP))")),
        _p("GPUs per driver version", "GPUs",
           ("{DCGM_FI_DRIVER_VERSION}", "count by (DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP)"))),
    "vmalert-outage": (
        _p("Driver versions in the fleet (the fleet-wide alert vmalert evaluates)", "versions",
           ("versions", "count(count by (DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP))")),
        _p("vmalert and VictoriaMetrics scrape health (FleetRulesBlind reads it)", "up",
           ("{instance}", f'up{{job="{GLOBAL_JOB}"}}'))),
    "node-down": (
        _p("Scrape health of the node", "up", ("dcgm exporter", f'up{{{DCGM_SELECTOR},$host}}'),
           ("vLLM engine", f'up{{{VLLM_SELECTOR},$host}}')),),
    "slo-burn": (
        _p("Request error ratio (all serving nodes)", "ratio",
           ("errors", 'sum(rate(vllm:request_success_total{finished_reason="error"}[$w])) '
                      "/ sum(rate(vllm:request_success_total[$w]))")),
        _p("Availability error-budget burn rate, every window the rules record", "x budget",
           ("burn rate", '{__name__=~"slo:burn_rate:ratio_rate.+",slo="availability"}'))),
}
#: Fault kinds whose drill is named differently (``{"kind": "down"}`` is node-down, ...).
_KIND_ALIASES = {"down": "node-down", "driver": "driver-skew"}
GENERIC: tuple[Panel, ...] = (
    _p("GPU temperature", "degrees C", ("GPU {gpu}", "DCGM_FI_DEV_GPU_TEMP{$gpu}")), _SM_CLOCK, _POWER)


def panels_for(result: dict) -> tuple[Panel, ...]:
    """The panels of a drill result: by drill name, else by its first fault's kind, else generic."""
    if result.get("drill") in PANELS:
        return PANELS[result["drill"]]
    for fault in result.get("faults") or ():
        kind = _KIND_ALIASES.get(str(fault.get("kind")), str(fault.get("kind")))
        if kind in PANELS:
            return PANELS[kind]
    return GENERIC


def kernel_log_variant(spec: DrillSpec) -> DrillSpec:
    """The drill as it plays on a stack whose nodes run logwatch (``state["logwatch"]``).

    There the kernel-log alerts page and the DCGM Xid alerts stand aside in their own expressions
    (prometheus/rules/gpu-xid.yml: ``unless`` the node's logwatch reads its source), so the DCGM path
    cannot fire and is not awaited: an Xid pages as ``GpuKernelXid*`` at the first evaluation that
    sees the line (firing while the line is recent: 5 minutes, 1 minute in the drill profile), Xid 79
    as ``GpuFallenOffBus`` (at once; ``GpuMissing`` inhibited), and an ECC DBE pages once: its
    kernel-log Xid 48 and the DBE join one Alertmanager group (grouped by node and GPU).
    """
    kernel = {"GpuXidCritical": "GpuKernelXidCritical", "GpuXidWarning": "GpuKernelXidWarning",
              "GpuMissing": "GpuFallenOffBus"}
    expect = tuple(replace(e, alertname=kernel.get(e.alertname, e.alertname)) for e in spec.expect)
    allowed = set(spec.allowed) | {e.alertname for e in spec.expect if e.alertname in kernel}
    if any(e.alertname.startswith("GpuXid") for e in spec.expect) or "GpuXidCritical" in spec.allowed:
        allowed |= {"GpuKernelXidCritical", "GpuKernelXidWarning"} - {e.alertname for e in expect}
    if any(e.alertname == "GpuMissing" for e in spec.expect):
        gpu = next((f["gpu"] for f in spec.faults if f.get("kind") == "xid"), None)
        expect = tuple(replace(e, labels={**e.labels, "gpu": str(gpu)}) if e.alertname == "GpuFallenOffBus"
                       and gpu is not None else e for e in expect)
    return replace(spec, expect=expect, allowed=frozenset(allowed))

