"""What an incident costs: the workloads on its nodes and GPUs and what they lost, read from Prometheus.

The on-call's second question after "what broke" is "what is it costing us". For an incident (its
nodes by the fleet config's identity label, its GPUs by ``gpu``, its window from the first alert's
``startsAt`` to its resolution or now; an alert about a change rather than a node, a rollout notice,
names the nodes and span it touched in ``affected_nodes``/``affected_since``/``affected_until``
annotations) :func:`measure` answers with numbers and the PromQL that gives
each of them:

* **Join.** The workloads on the incident's GPUs come from dcgm-exporter's pod attribution labels
  (``pod``/``namespace``/``container`` on GPU series when its Kubernetes pod mapping is on, stored as
  ``exported_pod``/``exported_namespace``/``exported_container`` under a kube-prometheus
  ServiceMonitor whose target already has those labels; dcgm-exporter ``pkg/dcgmexporter/kubernetes.go``
  and prometheus-operator's ``honorLabels: false``). A serving engine joins when its target's ``pod``
  is one of them; without pod labels every engine and training job on the incident's nodes is joined
  by the identity label (``join: "node"``, said in the line).
* **Serving** (per engine: ``identity, instance, model_name, engine``): requests, requests failed
  (``vllm:request_success_total{finished_reason="error"}``, the availability SLI's bad event), requests
  over the TTFT SLO threshold (``vllm:time_to_first_token_seconds`` count minus the bucket at the
  threshold, the TTFT SLI's bad event), each also as the excess over the node's own rate in the
  ``baseline_s`` before the incident; **goodput lost**: good requests (TTFT within the threshold and
  not failed) the engine served at its baseline rate over the window, minus those it served
  (requests, and requests/s over the window). Node-local: traffic a load balancer moved to other
  nodes counts as lost here.
* **Training** (per ``training_job`` with a rank on the incident's nodes): the job's GPUs (its rank
  series across the fleet), ranks stalled (ranks whose step counter stayed flat for
  :data:`STALL_INTERVALS` of its normal step intervals, at least :data:`STALL_S`, in a stretch
  overlapping the window; a stall that began
  before the alert, which waits for it, counts from its start), stalled time (the longest such rank's
  flat time), steps lost (stalled time x the steps/s before the stall) and **GPU-hours lost** (the
  job's GPUs x stalled time,
  the effective-training-time measure of Meta's "Revisiting Reliability in Large-Scale Machine
  Learning Research Clusters", 2024).
* **Fleet**: GPUs out (the incident's GPUs, or every GPU of its nodes when it names none) of the
  fleet's GPUs (``DCGM_FI_DEV_GPU_TEMP`` series by identity and ``gpu`` over the window; a MIG GPU
  counts once).

Counters are read as raw samples (one range-vector query per metric at the window's end) and
differenced here with counter resets handled (a drop restarts from the new value) and no
extrapolation, so a young series or a node that stopped reporting gives exact counts; the
``queries`` of the result are the ``increase()`` forms that give the same numbers in Prometheus up to
its extrapolation to the window's edges. Works on any Prometheus-API backend (Prometheus 2.x/3.x,
VictoriaMetrics: plain range-vector selectors only).

Errors: :class:`gpuobs.promapi.prometheus.PrometheusError` from the backend propagates (the caller
keeps the last measurement and says so).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Iterable

from gpuobs.core.fleet import FleetConfig
from gpuobs.core import log
from gpuobs.promapi.prometheus import PromClient, Series

#: The node's own period before the incident that sets its baseline rates, seconds.
BASELINE_S = 900.0
#: A rank is stalled when its step counter stays flat for 4 of its normal step intervals (the median
#: gap between samples that show a step, so at least 4 scrapes) and at least this long, seconds.
STALL_S = 10.0
STALL_INTERVALS = 4
#: The longest window measured (an incident open longer is measured over its last week), seconds.
MAX_WINDOW_S = 7 * 86400.0
#: Shortest baseline that sets a rate: with less (a young stack, a series relabelled just before the
#: incident) the excess and goodput figures say "no baseline" rather than report traffic noise, seconds.
MIN_BASELINE_S = 60.0
#: Goodput lost within this many standard deviations of the baseline's Poisson traffic noise
#: (sqrt of the good requests expected over the window) is reported as "within traffic noise".
NOISE_SD = 2.0
#: Shortest window: below one scrape or two there is nothing to difference, seconds.
MIN_WINDOW_S = 1.0
_log = log.get("pager")
_POD_LABELS = ("exported_pod", "exported_namespace", "exported_container", "pod", "namespace", "container")


@dataclass(frozen=True)
class ImpactConfig:
    """What :func:`measure` needs besides the incident: the fleet config (identity label, selectors),
    the TTFT SLO threshold (seconds, a vLLM bucket boundary: ``prometheus/slo.yaml``) and the baseline."""

    fleet: FleetConfig
    ttft_threshold_s: float
    baseline_s: float = BASELINE_S


def load_config(fleet: FleetConfig, slo_config=None) -> ImpactConfig:
    """The impact config of ``fleet`` with the TTFT threshold of ``slo_config`` (a path; default the
    shipped ``prometheus/slo.yaml``). Raises SloConfigError (an input error) for a bad file or one
    without the ``ttft`` SLO."""
    from pathlib import Path

    from gpuobs.core import assets
    from gpuobs.mixin.slo_rules import SloConfigError, load_config as load_slos

    slos = load_slos(Path(slo_config) if slo_config else assets.path("prometheus/slo.yaml"))
    ttft = next((s["ttft_threshold_seconds"] for s in slos["slos"] if s["name"] == "ttft"), None)
    if ttft is None:
        raise SloConfigError("slos: impact needs the ttft SLO (slos[].name: ttft) for its threshold")
    return ImpactConfig(fleet, float(ttft))


def of_alert(alert: dict, now: float) -> dict:
    """An incident-shaped dict for one alert that is not (yet) an incident (a rollout's notice before
    Alertmanager delivers it): what :func:`measure` reads."""
    return {"nodes": [], "gpus": [], "alerts": [alert], "opened_at": now, "state": "open", "resolved_at": None}


def _ts(text: str | None) -> float | None:
    if not text or text.startswith("0001-"):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def affected(inc: dict) -> tuple[list[str], list[str]]:
    """``(nodes, gpus)`` the incident touched: its own (the identity label, ``gpu``), else the nodes its
    alerts name in an ``affected_nodes`` annotation (comma-separated; a rollout notice's stage)."""
    nodes = list(inc.get("nodes") or [])
    if not nodes:
        seen: dict[str, None] = {}  # ordered and O(1) per name: the annotation may name thousands
        for a in inc.get("alerts", []):
            for n in (a.get("annotations") or {}).get("affected_nodes", "").split(","):
                if n.strip():
                    seen.setdefault(n.strip(), None)
        nodes = list(seen)
    return nodes, list(inc.get("gpus") or [])


def window(inc: dict, now: float) -> tuple[float, float]:
    """``(start, end)`` unix seconds: the earliest alert ``startsAt`` or ``affected_since`` annotation
    (else ``opened_at``) to ``resolved_at`` (else ``now``), cut at the latest ``affected_until``
    annotation when every alert has one, at most :data:`MAX_WINDOW_S` long."""
    alerts = inc.get("alerts", [])
    starts = [t for a in alerts for t in (_ts(a.get("startsAt")), _ts((a.get("annotations") or {}).get("affected_since")))
              if t is not None]
    start = min(starts + [inc["opened_at"]])
    end = inc["resolved_at"] if inc.get("state") == "resolved" and inc.get("resolved_at") else now
    untils = [_ts((a.get("annotations") or {}).get("affected_until")) for a in alerts]
    if alerts and None not in untils:
        end = min(end, max(untils))
    end = max(end, start + MIN_WINDOW_S)
    return max(start, end - MAX_WINDOW_S), end


def _str(value: str) -> str:
    """A PromQL double-quoted string literal's body (a raw newline would end the query: escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")


def _regex_alt(values: Iterable[str]) -> str:
    """``a|b`` matching exactly the values (RE2 metacharacters escaped), as a string literal's body."""
    meta = set(".^$*+?()[]{}|\\")
    return _str("|".join("".join("\\" + c if c in meta else c for c in v) for v in sorted(set(values))))


def increase(series: Series, t0: float, t1: float) -> tuple[float, float]:
    """``(increase, seconds covered)`` of a counter between ``t0`` and ``t1`` from its raw samples.

    Starts at the last sample at or before ``t0`` (else the first inside), ends at the last sample at or
    before ``t1``; a drop is a counter reset (the new value counts from zero, as Prometheus's
    ``increase`` does); no extrapolation; NaN and ±Inf samples are skipped (a stale marker or a broken
    exporter's value is no count). ``(0, 0)`` with fewer than two samples.
    """
    pts = [(t, v) for t, v in zip(series.timestamps, series.values) if t <= t1 and math.isfinite(v)]
    before = [p for p in pts if p[0] <= t0]
    inside = [p for p in pts if p[0] > t0]
    use = ([before[-1]] if before else []) + inside
    if len(use) < 2:
        return 0.0, 0.0
    total = 0.0
    for (_, a), (_, b) in zip(use, use[1:]):
        total += b - a if b >= a else b
    return total, use[-1][0] - use[0][0]


def stalls(series: Series, t0: float, t1: float, lo: float, min_s: float) -> list[tuple[float, float]]:
    """The counter's flat stretches (``(from, to)`` unix s) of at least ``min_s`` seconds that overlap
    [t0, t1], from raw samples since ``lo``: from the sample that last showed an increase (or the first
    sample) to the next one that shows one (or the last sample, a stall still going on). A stretch that
    began before ``t0`` is kept whole: the stall began before the alert did (its rule's detection lag)."""
    pts = [(t, v) for t, v in zip(series.timestamps, series.values) if lo <= t <= t1 and math.isfinite(v)]
    out: list[tuple[float, float]] = []
    if not pts:
        return out
    since, prev = pts[0][0], pts[0][1]
    for t, v in pts[1:]:
        if v != prev:
            if t - since >= min_s and t >= t0:
                out.append((since, t))
            since, prev = t, v
    if pts[-1][0] - since >= min_s and pts[-1][0] >= t0:
        out.append((since, pts[-1][0]))
    return out


def step_gap(series: Series, t0: float, t1: float) -> float | None:
    """The counter's normal step interval in [t0, t1], seconds: the (lower) median gap between samples
    that show an increase (a stall is rare, so it does not move the median), else, with fewer than three
    such gaps (a young series, or one stalled most of the time), the median gap between samples; None
    with fewer than two samples."""
    pts = [(t, v) for t, v in zip(series.timestamps, series.values) if t0 <= t <= t1 and math.isfinite(v)]
    ups = [t for (t, v), (_, p) in zip(pts[1:], pts) if v != p]
    gaps = sorted(b - a for a, b in zip(ups, ups[1:]))
    if len(gaps) < 3:  # too few steps seen to tell their pace from a stall: the scrape spacing
        gaps = sorted(b[0] - a[0] for a, b in zip(pts, pts[1:]))
    return gaps[(len(gaps) - 1) // 2] if gaps else None  # the lower median


def merge(series: list[Series], by: tuple[str, ...] = ()) -> list[Series]:
    """``series`` merged into one per value of the ``by`` labels: the samples of all of them in time
    order (at a timestamp two share, the larger value). For one counter whose labels changed mid-way
    (a canary's ``track`` label added and removed on the same engine): its values run on, so the merged
    series' increase is the counter's, where per-series increases would lose each switch's interval.
    A value that drops is still a reset (:func:`increase`)."""
    groups: dict[tuple, dict[float, float]] = {}
    first: dict[tuple, Series] = {}
    for s in series:
        k = _key(s.labels, by)
        first.setdefault(k, s)
        pts = groups.setdefault(k, {})
        for t, v in zip(s.timestamps, s.values):
            pts[t] = max(v, pts.get(t, v))
    out = []
    for k, pts in groups.items():
        ts = sorted(pts)
        out.append(Series(first[k].labels, tuple(ts), tuple(pts[t] for t in ts)))
    return out


def _key(labels, names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(labels.get(n, "") for n in names)


def _workload_pods(series: Iterable[Series]) -> dict[str, list[dict[str, str]]]:
    """GPU -> workload pods from dcgm-exporter's pod attribution labels (``exported_*`` first: under a
    ServiceMonitor ``pod`` is the exporter's own pod)."""
    out: dict[str, list[dict[str, str]]] = {}
    for s in series:
        lab = s.labels
        if lab.get("exported_pod"):
            pod = {"namespace": lab.get("exported_namespace", ""), "pod": lab["exported_pod"],
                   "container": lab.get("exported_container", "")}
        elif lab.get("pod") and "dcgm-exporter" not in lab.get("pod", "") and "dcgm" not in lab.get("container", "dcgm"):
            pod = {"namespace": lab.get("namespace", ""), "pod": lab["pod"], "container": lab.get("container", "")}
        else:
            continue
        mine = out.setdefault(lab.get("gpu", ""), [])
        if pod not in mine:
            mine.append(pod)
    return out


def measure(prom: PromClient, cfg: ImpactConfig, inc: dict, now: float) -> dict:
    """The impact of ``inc`` (a :func:`gpuobs.pager.incidents.get` dict: ``nodes``, ``gpus``, ``alerts``,
    ``opened_at``, ``state``, ``resolved_at``) at ``now`` (unix s).

    Returns ``{"measured_at", "window": {"start", "end", "seconds"}, "baseline_s", "join": "pod"|"node"|"none",
    "pods": [{"gpu", "namespace", "pod", "container"}], "serving": [...], "training": [...], "fleet":
    {"gpus_total", "gpus_out", "capacity_out_ratio"}, "totals": {...}, "queries": {name: PromQL},
    "line": str}`` (see the module docstring for every number; counts are requests, steps, seconds,
    GPU-hours). An incident without nodes gets ``join: "none"`` and no workloads. Raises
    PrometheusError when the backend fails.
    """
    fleet = cfg.fleet
    ident = fleet.identity_label
    start, end = window(inc, now)
    dur = end - start
    b0 = start - cfg.baseline_s
    rng = f"{math.ceil(end - b0) + 1}s"
    nodes, gpus = affected(inc)
    doc: dict = {"measured_at": now, "window": {"start": start, "end": end, "seconds": round(dur, 3)},
                 "baseline_s": cfg.baseline_s, "join": "none", "pods": [], "serving": [], "training": [],
                 "fleet": {}, "queries": {}}
    q = doc["queries"]
    win = f"{round(dur)}s"
    at = dt.datetime.fromtimestamp(end, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc["evaluated_at"] = at

    # ---- fleet capacity -------------------------------------------------------------------------------
    dcgm_all = f'DCGM_FI_DEV_GPU_TEMP{{{fleet.dcgm_selector}, {ident}!=""}}'
    total_q = f"count(group by ({ident}, gpu) (last_over_time({dcgm_all}[{rng}])))"
    gpus_total = prom.query(total_q, at=end).scalar() or 0.0
    gpus_total = gpus_total if math.isfinite(gpus_total) else 0.0  # NaN/Inf: no count
    q["gpus_total"] = total_q
    if not nodes:
        doc["fleet"] = {"gpus_total": int(gpus_total), "gpus_out": 0, "capacity_out_ratio": 0.0}
        doc["totals"] = _totals(doc)
        doc["line"] = line(doc, cfg)
        return doc
    node_m = f'{ident}=~"{_regex_alt(nodes)}"'
    gpu_m = f', gpu=~"{_regex_alt(gpus)}"' if gpus else ""
    dcgm_inc = f"DCGM_FI_DEV_GPU_TEMP{{{fleet.dcgm_selector}, {node_m}{gpu_m}}}"
    attr_q = (f"group by ({ident}, gpu, {', '.join(_POD_LABELS)}) (last_over_time({dcgm_inc}[{rng}]))")
    attr = prom.query(attr_q, at=end)
    q["gpus_out"] = f"count(group by ({ident}, gpu) (last_over_time({dcgm_inc}[{win}])))"
    # Out of service: the incident's own node or GPUs; a notice's affected nodes (a rollout stage) kept
    # serving, so they count for the workloads' losses but not as capacity out.
    own = set(inc.get("nodes") or [])
    gpus_out = (len({(s.labels.get(ident, ""), s.labels.get("gpu", "")) for s in attr.samples
                     if s.labels.get(ident, "") in own}) or len(gpus)) if own else 0
    doc["fleet"] = {"gpus_total": int(gpus_total), "gpus_out": gpus_out,
                    "capacity_out_ratio": round(gpus_out / gpus_total, 4) if gpus_total else 0.0}
    pods = _workload_pods(Series(s.labels, (), ()) for s in attr.samples)
    doc["pods"] = [{"gpu": g, **p} for g in sorted(pods, key=lambda x: (len(x), x)) for p in pods[g]]
    pod_names = {p["pod"] for ps in pods.values() for p in ps}
    doc["join"] = "pod" if pod_names else "node"

    # ---- serving ----------------------------------------------------------------------------------------
    ekey = (ident, "instance", "model_name", "engine")
    vsel = f"{fleet.vllm_selector}, {node_m}"
    le = repr(float(cfg.ttft_threshold_s))
    success = prom.query(f"vllm:request_success_total{{{vsel}}}[{rng}]", at=end).series
    ttft_good = prom.query(f'vllm:time_to_first_token_seconds_bucket{{{vsel}, le="{le}"}}[{rng}]', at=end).series
    ttft_all = prom.query(f"vllm:time_to_first_token_seconds_count{{{vsel}}}[{rng}]", at=end).series
    engines: dict[tuple, dict] = {}
    for s in success + ttft_good + ttft_all:
        if doc["join"] == "pod" and s.labels.get("pod") and s.labels["pod"] not in pod_names:
            continue  # an engine on the node whose pod owns none of the incident's GPUs
        engines.setdefault(_key(s.labels, ekey), {"pod": s.labels.get("pod", "")})
    for key in sorted(engines):
        e = {n: v for n, v in zip(ekey, key)}
        e["pod"] = engines[key]["pod"]
        # One counter per engine (and finished_reason): series of the engine that differ only in other
        # labels (a rollout's `track`, a release label) are one counter relabelled, merged in time.
        mine = lambda ss: merge([s for s in ss if _key(s.labels, ekey) == key], ("finished_reason",))  # noqa: E731
        fail = [s for s in mine(success) if s.labels.get("finished_reason") == "error"]
        tot_d = sum(increase(s, start, end)[0] for s in mine(success))
        tot_b, cov_b = _sum_cov(mine(success), b0, start)
        fail_d = sum(increase(s, start, end)[0] for s in fail)
        fail_b = sum(increase(s, b0, start)[0] for s in fail)
        good_d = sum(increase(s, start, end)[0] for s in mine(ttft_good))
        good_b = sum(increase(s, b0, start)[0] for s in mine(ttft_good))
        cnt_d = sum(increase(s, start, end)[0] for s in mine(ttft_all))
        cnt_b = sum(increase(s, b0, start)[0] for s in mine(ttft_all))
        over_d, over_b = max(0.0, cnt_d - good_d), max(0.0, cnt_b - good_b)
        gp_d, gp_b = max(0.0, good_d - fail_d), max(0.0, good_b - fail_b)
        based = cov_b >= MIN_BASELINE_S
        base_rate = gp_b / cov_b if based else None
        lost = max(0.0, base_rate * dur - gp_d) if base_rate is not None else None
        noise = NOISE_SD * math.sqrt(base_rate * dur) if base_rate is not None else None
        e.update({
            "requests": round(tot_d), "failed": round(fail_d),
            "failed_excess": round(max(0.0, fail_d - (fail_b / tot_b if tot_b else 0.0) * tot_d)) if based else None,
            "over_ttft_slo": round(over_d),
            "over_ttft_slo_excess": (round(max(0.0, over_d - (over_b / cnt_b if cnt_b else 0.0) * cnt_d))
                                     if based else None),
            "goodput_lost_noise": round(noise) if noise is not None else None,
            "baseline_seconds": round(cov_b, 1),
            "baseline_requests_per_s": round(tot_b / cov_b, 4) if cov_b > 0 else None,
            "baseline_goodput_per_s": round(base_rate, 4) if base_rate is not None else None,
            "goodput": round(gp_d),
            "goodput_lost": round(lost) if lost is not None else None,
            "goodput_lost_per_s": round(lost / dur, 4) if lost is not None and dur > 0 else None,
        })
        doc["serving"].append(e)
    sel1 = f"{fleet.vllm_selector}, {node_m}"
    q["requests"] = f"sum(increase(vllm:request_success_total{{{sel1}}}[{win}]))"
    q["failed"] = f'sum(increase(vllm:request_success_total{{{sel1}, finished_reason="error"}}[{win}]))'
    q["over_ttft_slo"] = (f"sum(increase(vllm:time_to_first_token_seconds_count{{{sel1}}}[{win}])) - "
                          f'sum(increase(vllm:time_to_first_token_seconds_bucket{{{sel1}, le="{le}"}}[{win}]))')
    q["goodput"] = (f'sum(increase(vllm:time_to_first_token_seconds_bucket{{{sel1}, le="{le}"}}[{win}])) - '
                    f'sum(increase(vllm:request_success_total{{{sel1}, finished_reason="error"}}[{win}]))')
    covered = round(max((e["baseline_seconds"] for e in doc["serving"]), default=cfg.baseline_s)) or 1
    # the baseline the pager used: the node's own samples before the window (up to baseline_s; fewer on a
    # young series), so the same span here
    q["baseline_goodput_per_s"] = (f"({q['goodput'].replace(f'[{win}]', f'[{covered}s] offset {win}')}) / {covered}")
    if not doc["serving"]:
        for k in ("requests", "failed", "over_ttft_slo", "goodput", "baseline_goodput_per_s"):
            q.pop(k)

    # ---- training -----------------------------------------------------------------------------------------
    steps_here = prom.query(f'training_steps_total{{{node_m}}}[{rng}]', at=end).series
    jobs = sorted({s.labels.get("training_job", "") for s in steps_here} - {""})
    if jobs:
        job_m = f'training_job=~"{_regex_alt(jobs)}"'
        ranks = prom.query(f'training_steps_total{{{job_m}, {ident}!=""}}[{rng}]', at=end).series
        q["training_gpus"] = f'count by (training_job) (training_steps_total{{{job_m}, {ident}!=""}})'
        q["steps"] = f"max by (training_job) (increase(training_steps_total{{{job_m}}}[{win}]))"
        q["ranks_without_a_step"] = (f"count by (training_job) (changes(training_steps_total{{{job_m}}}"
                                     f"[{{stall_min_s}}s]) == 0)  # at the stall's end; stall_min_s per job")
        for job in jobs:
            mine = merge([s for s in ranks if s.labels.get("training_job") == job], (ident, "rank"))
            ids = {(s.labels.get(ident, ""), s.labels.get("rank", "")) for s in mine}
            steps_d = max((increase(s, start, end)[0] for s in mine), default=0.0)
            # A stall is a flat stretch of STALL_INTERVALS normal step intervals (at least STALL_S); it
            # may have begun before the alert (the rule waits for it).
            gaps = sorted(g for g in (step_gap(s, b0, end) for s in mine) if g is not None)
            min_s = max(STALL_S, STALL_INTERVALS * gaps[(len(gaps) - 1) // 2]) if gaps else 6 * STALL_S
            per_rank = [stalls(s, start, end, b0, min_s) for s in mine]
            spans = [sp for r in per_rank for sp in r]
            since = min((a for a, _ in spans), default=None)
            stalled_s = max((sum(b - a for a, b in r) for r in per_rank), default=0.0)
            base = [increase(s, b0, since if since is not None else start) for s in mine]
            rate = max((inc_ / cov for inc_, cov in base if cov > 0), default=None)
            doc["training"].append({
                "training_job": job, "gpus": len(ids),
                "ranks_on_incident_nodes": sum(1 for s in steps_here if s.labels.get("training_job") == job),
                "ranks_stalled": sum(bool(r) for r in per_rank), "steps": round(steps_d),
                "stalled_since": since, "stall_min_s": round(min_s, 1),
                "baseline_steps_per_s": round(rate, 4) if rate else None,
                "steps_lost": round(rate * stalled_s, 1) if rate else None,
                "stalled_s": round(stalled_s, 1),
                "gpu_hours_lost": round(len(ids) * stalled_s / 3600.0, 3),
            })
    doc["totals"] = _totals(doc)
    doc["line"] = line(doc, cfg)
    return doc


def _sum_cov(series: list[Series], t0: float, t1: float) -> tuple[float, float]:
    """Summed increase and the longest coverage among ``series`` over [t0, t1]."""
    parts = [increase(s, t0, t1) for s in series]
    return sum(p[0] for p in parts), max((p[1] for p in parts), default=0.0)


def _totals(doc: dict) -> dict:
    sv, tr = doc["serving"], doc["training"]
    return {"requests_failed": sum(e["failed"] for e in sv),
            "requests_over_ttft_slo": sum(e["over_ttft_slo"] for e in sv),
            "goodput_lost": sum(e["goodput_lost"] or 0 for e in sv),
            "goodput_lost_per_s": round(sum(e["goodput_lost_per_s"] or 0.0 for e in sv), 4),
            "gpu_hours_lost": round(sum(t["gpu_hours_lost"] or 0.0 for t in tr), 3),
            "ranks_stalled": sum(t["ranks_stalled"] for t in tr)}


def _n(x: float | None, unit: str = "") -> str:
    if x is None:
        return "unknown"
    return f"{x:,.0f}{unit}" if abs(x) >= 10 or float(x).is_integer() else f"{x:.2f}{unit}"


def _dur(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _count(n: float | None, what: str) -> str:
    if n is None:
        return f"{what}s: no baseline"
    return f"{_n(n)} {what}{'' if n == 1 else 's'}"


def line(doc: dict, cfg: ImpactConfig) -> str:
    """The one-line impact the console, the CLI and the drills print (numbers as in ``doc``)."""
    parts = []
    for e in doc["serving"]:
        lost = e["goodput_lost"]
        if lost is None:
            gp = "goodput lost: no baseline (under 60 s of data before)"
        elif e["goodput_lost_noise"] is not None and lost <= e["goodput_lost_noise"]:
            gp = f"no goodput lost beyond traffic noise (+-{_n(e['goodput_lost_noise'])} requests)"
        else:
            gp = f"goodput lost {_count(lost, 'request')} ({_n(e['goodput_lost_per_s'])} req/s)"
        excess = (lambda x: "" if x is None else f" ({_n(x)} above baseline)")
        parts.append(
            f"serving {e['model_name'] or 'engine'} on {e[cfg.fleet.identity_label]}: {_count(e['failed'], 'request')} "
            f"failed{excess(e['failed_excess'])}, {_n(e['over_ttft_slo'])} over the {cfg.ttft_threshold_s:g} s TTFT "
            f"SLO{excess(e['over_ttft_slo_excess'])}, {gp}")
    for t in doc["training"]:
        before = (" (from before the alert)" if t.get("stalled_since") is not None
                  and t["stalled_since"] < doc["window"]["start"] else "")
        parts.append(
            f"training {t['training_job']}: {t['ranks_stalled']}/{t['gpus']} ranks stalled {_dur(t['stalled_s'])}"
            f"{before}, {_n(t['steps_lost'])} steps lost, {_n(t['gpu_hours_lost'])} GPU-hours lost")
    f = doc["fleet"]
    if f and f["gpus_out"]:
        parts.append(f"capacity out: {f['gpus_out']} of {f['gpus_total']} GPUs ({100 * f['capacity_out_ratio']:.1f}%)")
    if doc["join"] == "node" and (doc["serving"] or doc["training"]):
        parts.append("joined by node (no pod attribution labels)")
    if not doc["serving"] and not doc["training"] and doc["join"] != "none":
        parts.append("no serving engine or training job on the node")
    head = _dur(doc["window"]["seconds"])
    return f"{head}: " + "; ".join(parts) if parts else f"{head}: no node named"


class ImpactWatcher:
    """Measures every open incident's impact every ``every_s`` seconds and each resolved one once more
    after its resolution (the final figures over its whole window), storing them on the incident.

    ``measure_fn(inc, now) -> dict`` is :func:`measure` bound to a client and config. A failed
    measurement keeps the last stored one and adds ``error`` (one line) and ``error_at`` to it; an
    incident never measured gets ``{"error", "measured_at"}`` so the console says why it has no
    numbers. Resolved incidents older than ``lookback_s`` are not revisited.
    """

    def __init__(self, store, measure_fn, every_s: float = 30.0, lookback_s: float = 86400.0):
        from gpuobs.pager.periodic import Periodic

        watcher = self

        class _Loop(Periodic):
            failure = "impact measurement failed"

            def check(self, now: float):
                return watcher.check(now)

        self.store, self.measure_fn, self.every_s, self.lookback_s = store, measure_fn, every_s, lookback_s
        self._loop = _Loop(min(every_s, 5.0), "impact")

    def start(self) -> "ImpactWatcher":
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()

    def check(self, now: float) -> list[int]:
        """Measure what is due at ``now``; returns the ids measured (successfully or not)."""
        ids = self.store.impact_due(now, self.every_s, now - self.lookback_s)
        for iid in ids:
            self.measure_one(iid, now)
        return ids

    def measure_one(self, iid: int, now: float) -> dict:
        """Measure incident ``iid`` at ``now`` and store the result (or the error); returns what was stored.
        Raises IncidentNotFound for an unknown id."""
        from gpuobs.promapi.prometheus import PrometheusError

        inc = self.store.incident(iid)
        try:
            doc = self.measure_fn(inc, now)
        except Exception as exc:  # noqa: BLE001 (a bad sample or annotation must not lose the last numbers)
            if isinstance(exc, PrometheusError):
                msg = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            else:  # a bug or data it cannot read: the traceback goes to the log, not to the on-call
                _log.exception("impact measurement failed", extra={"fields": {"incident": iid}})
                msg = "internal error measuring the impact; see the pager log"
            try:  # re-read: another measurement may have stored newer numbers while this one waited
                last = self.store.incident(iid).get("impact")
            except Exception:  # noqa: BLE001
                last = inc.get("impact")
            doc = ({**last, "error": msg, "error_at": now} if last and "line" in last
                   else {"error": msg, "measured_at": now})
        self.store.record_impact(iid, doc)
        return doc
