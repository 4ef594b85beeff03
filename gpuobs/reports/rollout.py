"""The rollout's final report: canary against baseline, over the rollout and stage by stage.

Input contract (a plain dict, e.g. the rollout controller's final document; every key but
``final_verdict.metrics[].name`` is optional and has a fallback)::

    {
      "rollout_id": "r-20250601-1200",            # default "rollout"
      "version": "1.6.1", "baseline_version": "1.6.0",
      "state": "Succeeded" | "RolledBack" | "Rejected" | "Aborted",
      "reason": "why it ended (optional)",
      "started_at": 1748779200.0, "ended_at": 1748780100.0,   # epoch s (ISO 8601 strings accepted);
                                                  # default: first stage start / last stage end / now
      "stage_count": 3,                           # stages planned (default: len(spec.stages), else
                                                  # the stages that ran): "stage 1/3" as the CLI prints it
      "versions_before": {"gpu-node-00": "1.6.0"},   # the fleet when the rollout started (fallback for
                                                  # baseline_version when nothing was deployed)
      "gates": [{"gate": "compat", "outcome": "rejected", "detail": {<FleetReport.to_dict()>, "table": "..."}}],
      "events": [{"ts": ..., "kind": "pause" | "resume" | "promote", "operator": "...", "reason": "..."}],
      "transitions": [{"ts": ..., "from_state": ..., "to_state": ..., "stage": 0, "reason": ...}],
      "stages": [{"index": 0, "share": "5%", "nodes": ["gpu-node-00"],   # "hosts" accepted for "nodes"
                  "started_at": ..., "ended_at": ..., "verdict": "PROMOTE" | "HOLD" | "ROLLBACK" | ...}],
      "final_verdict": {"verdict": "PROMOTE", "reasons": [...], "warnings": [...],
                        "metrics": [{"name": "ttft", "classification": "Pass", "effect": 0.02,
                                     "interval": [-0.01, 0.05], "evidence": {"z": 1.2, "boundary": 3.1},
                                     "baseline": {"p50": 0.1, "p99": 0.9}, "canary": {...},
                                     "scale": "relative", "critical": true, "harmful": false}]},
      "assumptions": ["ttft, itl: node-to-node variation from ..."],  # each once (gpuobs.rollout.report.
                                                  # run_assumptions); default: final_verdict.assumptions
      "prometheus": "http://127.0.0.1:9090",      # no URL: tables only, plots omitted (noted)
      "canary_selector": 'track="canary"', "baseline_selector": 'track="baseline"',
      "report_model": "NVIDIA L40S"               # optional: a driver upgrade's plotted GPU model
    }

The report has: a header (versions, state, reason, the assumptions the canary verdicts rest on, each
once, duration, selectors), the stages table, the compatibility
gate's table (always when the gate ran; first thing after the summary on a Rejected rollout), the
timeline (transitions and operator decisions in UTC), the final verdict table, then canary against
baseline per track over time (:data:`OVER_TIME`: TTFT, ITL and E2E p50 and TTFT, ITL p99 over
:data:`QUANTILE_WINDOW` windows, error ratio and request rate over :data:`RATE_WINDOW`) with the stages
as shaded spans and boundaries on a UTC time axis, and the distributions of TTFT, ITL and E2E latency
from ``sum by (le) (increase(<metric>_bucket{<selector>}[<rollout duration>]))`` evaluated at its
end. The panels of the metric the verdict rested on (:func:`deciding_metric`) come first in both.
The compatibility table lists each node's failed and warned rules, and below it every failing rule
and warning with its message and source.

Every window comes from the rollout's own timeline: the distributions cover exactly [started_at,
ended_at]; each over-time panel starts one of its windows after ``started_at`` so that no ``rate()``
reaches back into samples from before the rollout (the previous rollout's canary carries the same
``track="canary"`` labels), and ends at ``ended_at`` (or now, for a rollout still running). Nothing
is padded.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from gpuobs.core.files import atomic_write
from gpuobs.promapi.prometheus import PromClient, PrometheusError, PrometheusQueryError
from gpuobs.reports import html as h
from gpuobs.reports.plots import Marker, Span, distribution_png, timeseries_png
from gpuobs.reports.query import client_for, fetch_lines, step_for, tidy

RATE_WINDOW = "1m"
RATE_WINDOW_S = 60.0
#: Window of the latency-quantile panels over time: ``histogram_quantile(q, sum by (le)
#: (rate(<hist>_bucket[3m])))``. A quantile over a 1-minute rate rests on one minute of one track's
#: requests (a 5% canary: tens of requests), so its p99 jumps by the single slowest request; 3 minutes
#: triples the requests behind each point while still resolving a stage (the controller's stages last
#: minutes). Its first point is 3 minutes after the rollout started (no window reaches before it).
QUANTILE_WINDOW = "3m"
QUANTILE_WINDOW_S = 180.0


class OverTime(NamedTuple):
    """One panel over time: ``expr`` is a template with ``{sel}`` (track selector) and ``{w}`` (its
    ``window``, ``window_s`` seconds); ``metric``: the canary metric it shows (gpuobs/canary/data/
    metrics.yaml names), whose panels come first when the verdict rested on it (:func:`deciding_metric`)."""

    title: str
    unit: str
    expr: str
    window: str
    window_s: float
    metric: str | None


def _quantile(q: float, hist: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({hist}_bucket{{{{{{sel}}}}}}[{{w}}])))"


_Q = (QUANTILE_WINDOW, QUANTILE_WINDOW_S)
_R = (RATE_WINDOW, RATE_WINDOW_S)
#: Histograms shown as distributions: (metric, title, unit, canary metric name).
DISTRIBUTIONS = (("vllm:time_to_first_token_seconds", "TTFT", "s", "ttft"),
                 ("vllm:inter_token_latency_seconds", "Inter-token latency", "s", "itl"),
                 ("vllm:e2e_request_latency_seconds", "End-to-end request latency", "s", "e2e"))
#: Panels over time, canary against baseline: the p50 (the shift a location test decides on) and the
#: p99 of each latency, the error ratio and the request rate.
OVER_TIME = (
    OverTime("TTFT p50", "s", _quantile(0.5, "vllm:time_to_first_token_seconds"), *_Q, "ttft"),
    OverTime("TTFT p99", "s", _quantile(0.99, "vllm:time_to_first_token_seconds"), *_Q, "ttft"),
    OverTime("Inter-token latency p50", "s", _quantile(0.5, "vllm:inter_token_latency_seconds"), *_Q, "itl"),
    OverTime("Inter-token latency p99", "s", _quantile(0.99, "vllm:inter_token_latency_seconds"), *_Q, "itl"),
    OverTime("End-to-end request latency p50", "s", _quantile(0.5, "vllm:e2e_request_latency_seconds"), *_Q, "e2e"),
    OverTime("Request error ratio", "ratio",
             'sum(rate(vllm:request_success_total{{{sel},finished_reason="error"}}[{w}])) '
             "/ sum(rate(vllm:request_success_total{{{sel}}}[{w}]))", *_R, "error_ratio"),
    OverTime("Request rate (traffic share per track)", "requests per second",
             "sum(rate(vllm:request_success_total{{{sel}}}[{w}]))", *_R, None),
)
_STATE_KIND = {"Succeeded": "ok", "RolledBack": "bad", "Rejected": "bad", "Aborted": "warn"}
_VERDICT_KIND = {"PROMOTE": "ok", "ROLLBACK": "bad", "HOLD": "warn"}
_CLASS_KIND = {"Pass": "ok", "NoData": "info", "Inconclusive": "warn"}


def epoch(value: Any) -> float | None:
    """Epoch seconds from a number or an ISO 8601 string (``Z`` allowed); None when absent or invalid."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    try:
        return float(value)
    except (TypeError, ValueError):
        pass
    try:
        parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)).timestamp()


def _selector(text: Any, default: str) -> str:
    s = str(text or default).strip()
    return s[1:-1].strip() if s.startswith("{") and s.endswith("}") else s


def rollout_window(doc: dict, now: float | None = None) -> tuple[float, float]:
    """[start, end] of the rollout, unpadded: its own times, else the stages', else (end) now.

    A rollout still running (no ``ended_at``, state not terminal) ends now; a terminal one without
    ``ended_at`` ends at its last stage's end. Never ``end < start``."""
    now = time.time() if now is None else now
    stages = _stages(doc)
    starts = [s for s in (epoch(st.get("started_at")) for st in stages) if s is not None]
    ends = [e for e in (epoch(st.get("ended_at")) for st in stages) if e is not None]
    end = epoch(doc.get("ended_at"))
    if end is None:
        end = max(ends) if ends and doc.get("state") in _STATE_KIND else now
    start = epoch(doc.get("started_at"))
    if start is None:
        start = min(starts) if starts else end
    return start, max(end, start)


def stage_count(doc: dict) -> int:
    """Stages planned: ``stage_count``, else ``len(spec.stages)``, else the stages that ran."""
    n = doc.get("stage_count")
    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
        return n
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    if isinstance(spec.get("stages"), list) and spec["stages"]:
        return len(spec["stages"])
    return len(_stages(doc))


def baseline_version(doc: dict) -> str | None:
    """The version the canary was judged against: ``baseline_version``, else the most common version
    of ``versions_before`` (the fleet when the rollout started; a Rejected rollout deployed nothing,
    so that is what it was refused against), else None."""
    v = doc.get("baseline_version")
    if v:
        return str(v)
    before = doc.get("versions_before")
    if not isinstance(before, dict):
        spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
        before = spec.get("versions_before")
    vals = [str(x) for x in (before or {}).values() if x and str(x) != str(doc.get("version"))] \
        if isinstance(before, dict) else []
    return max(sorted(set(vals)), key=vals.count) if vals else None


def _stages(doc: dict) -> list[dict]:
    return [s for s in doc.get("stages") or [] if isinstance(s, dict)]


def bucket_counts(samples: Sequence[tuple[str, float]]) -> tuple[list[float], list[float]]:
    """Finite ``le`` bounds and per-bucket counts (last one +Inf) from cumulative ``(le, count)`` pairs.

    Cumulative counts are made monotonic first (as histogram_quantile does)."""
    pairs = sorted(((float(le), c) for le, c in samples if c == c), key=lambda p: p[0])
    bounds = [b for b, _ in pairs if math.isfinite(b)]
    cum, acc = [], 0.0
    for _, c in pairs:
        acc = max(acc, c)
        cum.append(acc)
    if pairs and math.isfinite(pairs[-1][0]):  # no +Inf bucket: nothing above the last bound
        cum.append(cum[-1])
    counts = [cum[0]] + [b - a for a, b in zip(cum, cum[1:])] if cum else []
    return bounds, counts


def bucket_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """Prometheus' histogram_quantile on per-bucket counts: linear inside the bucket, NaN if empty."""
    total = sum(counts)
    if total <= 0 or not bounds:
        return math.nan
    rank, acc = q * total, 0.0
    for i, c in enumerate(counts):
        if acc + c >= rank and c > 0:
            if i >= len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i > 0 else (0.0 if bounds[0] > 0 else bounds[0])
            return lower + (bounds[i] - lower) * (rank - acc) / c
        acc += c
    return bounds[-1]


def _fmt_effect(value: Any, scale: str) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return f"{value * 100:+.1f}%" if scale == "relative" else f"{value:+.4g}"
    return h.num(value)


def _fmt_side(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={h.num(v)}" for k, v in value.items()) or "-"
    return h.num(value)


def _fmt_evidence(value: Any) -> str:
    if isinstance(value, dict):
        if "log_e" in value and isinstance(value.get("log_e"), (int, float)):
            e = math.exp(min(float(value["log_e"]), 700))
            bound = value.get("threshold")
            return f"e={e:.3g}" + (f" (bound {math.exp(bound):.3g})" if isinstance(bound, (int, float)) else "")
        return ", ".join(f"{k}={h.num(v, 3)}" for k, v in value.items()) or "-"
    return h.num(value)


def verdict_rows(metrics: Sequence[Any]) -> list[tuple]:
    """Table rows of the final verdict's metrics (tolerant of missing fields)."""
    rows = []
    for m in metrics:
        if not isinstance(m, dict):
            continue
        scale = "relative" if m.get("kind") == "errors" else str(m.get("scale", "relative"))
        iv = m.get("interval")
        interval = (f"[{_fmt_effect(iv[0], scale)}, {_fmt_effect(iv[1], scale)}]"
                    if isinstance(iv, (list, tuple)) and len(iv) == 2 else "-")
        cls = str(m.get("classification", "-"))
        kind = "bad" if m.get("harmful") else _CLASS_KIND.get(cls, "warn")
        rows.append((m.get("name", "?"), h.badge(cls + ("!" if m.get("harmful") else ""), kind),
                     _fmt_side(m.get("baseline")), _fmt_side(m.get("canary")), _fmt_effect(m.get("effect"), scale),
                     interval, _fmt_evidence(m.get("evidence") or m.get("reason")),
                     "-" if m.get("critical") is None else ("yes" if m.get("critical") else "no")))
    return rows


def deciding_metric(doc: dict) -> str | None:
    """The canary metric the final verdict rested on: the first harmful critical metric (what rolled
    back), else the first harmful one, else the first critical one not classified Pass/NoData, else the
    first critical one (what a PROMOTE was judged on); None without metrics."""
    fv = doc.get("final_verdict") if isinstance(doc.get("final_verdict"), dict) else {}
    ms = [m for m in fv.get("metrics") or [] if isinstance(m, dict) and m.get("name")]
    for pred in (lambda m: m.get("harmful") and m.get("critical"), lambda m: m.get("harmful"),
                 lambda m: m.get("critical") and m.get("classification") not in ("Pass", "NoData"),
                 lambda m: m.get("critical")):
        for m in ms:
            if pred(m):
                return str(m["name"])
    return None


def order_by_decision(items: Sequence, decided: str | None, key) -> list:
    """``items`` with those whose ``key(item)`` is the deciding metric first, order kept otherwise."""
    return sorted(items, key=lambda it: 0 if decided is not None and key(it) == decided else 1)


def _distributions(client: PromClient, sels: dict[str, str], versions: dict[str, str], start: float,
                   end: float, decided: str | None = None) -> list[h.Raw]:
    # whole seconds, rounded down: the window never reaches before the rollout started
    span = f"{max(1, int(math.floor(end - start)))}s"
    out: list[h.Raw] = []
    for metric, title, unit, _ in order_by_decision(DISTRIBUTIONS, decided, key=lambda d: d[3]):
        groups, notes, shared, rows = [], [], None, []
        for track, sel in sels.items():
            expr = tidy(f"sum by (le) (increase({metric}_bucket{{{sel}}}[{span}]))")
            try:
                res = client.query(expr, at=end)
            except PrometheusQueryError as exc:
                notes.append(f"query rejected ({exc.error_type}): {exc.message}: {expr}")
                continue
            bounds, counts = bucket_counts([(s.labels.get("le", "+Inf"), s.value) for s in res.samples])
            if not counts or sum(counts) <= 0:
                notes.append(f"no requests: {expr}")
                continue
            if shared is not None and bounds != shared:
                notes.append(f"{track}: bucket bounds differ from the other track's; not plotted")
                continue
            shared = bounds
            n = sum(counts)
            p50, p99 = bucket_quantile(0.5, bounds, counts), bucket_quantile(0.99, bounds, counts)
            groups.append((f"{track} {versions.get(track, '')} (n={n:.0f}, p50 {p50:.3g} {unit}, "
                           f"p99 {p99:.3g} {unit})", counts))
            rows.append((track, versions.get(track) or "-", f"{n:.0f}",
                         *(h.num(bucket_quantile(q, bounds, counts), 3) for q in (0.5, 0.9, 0.99))))
        png = distribution_png(title, unit, shared or [], groups)
        out.append(h.figure(png, f"{title}: requests over the whole rollout window ({span}), from "
                                 f"increase({metric}_bucket[{span}]) per track", alt=title))
        if rows:
            out.append(h.table(["track", "version", "requests", f"p50 ({unit})", f"p90 ({unit})", f"p99 ({unit})"],
                               rows, numeric=(2, 3, 4, 5)))
        if notes:
            out.append(h.bullet_list(notes))
    return out


def stage_label(st: dict, i: int, total: int) -> str:
    """``stage 1/3 5% PROMOTE`` (as the controller prints it; share and verdict when known)."""
    return " ".join(str(x) for x in (f"stage {_stage_no(st, i)}/{total}", st.get("share") or "",
                                     st.get("verdict") or "") if x)


def _stage_overlays(doc: dict, origin: float, end: float) -> tuple[list[Span], list[Marker]]:
    """Shaded stages and their start lines, x in seconds since ``origin``; the rollout's end marked."""
    stages, total = _stages(doc), stage_count(doc)
    spans, markers = [], []
    for i, st in enumerate(stages):
        s0 = epoch(st.get("started_at"))
        if s0 is None:
            continue
        nxt = epoch(stages[i + 1].get("started_at")) if i + 1 < len(stages) else None
        s1 = epoch(st.get("ended_at")) or nxt or end
        spans.append(Span(s0 - origin, min(s1, end) - origin, stage_label(st, i, total)))
        markers.append(Marker(s0 - origin, "stage start", "stage"))
    for ev in _events(doc):
        t = epoch(ev.get("ts"))
        if t is not None and origin <= t <= end:
            markers.append(Marker(t - origin, f"operator {ev.get('kind', '?')}", "paged"))
    if doc.get("state") in _STATE_KIND:
        markers.append(Marker(end - origin, f"rollout ended ({doc.get('state')})", "cleared"))
    return spans, markers


def over_time_range(start: float, end: float, now: float, window_s: float = RATE_WINDOW_S
                    ) -> tuple[float, float] | None:
    """``(first, last)`` evaluation instants of an over-time panel whose window is ``window_s``
    seconds: from one window after ``start`` (no rate() window reaches before the rollout) to ``end``
    capped at ``now``; None when the rollout was shorter than one window."""
    first, last = start + window_s, min(end, now)
    return (first, last) if last >= first else None


#: A driver upgrade's over-time panels start this long before it (seconds): its nodes are judged
#: against their own history, which the plot then shows (the identity selectors match the same series
#: before and after, unlike a release's ``track`` labels).
UPGRADE_LEAD_S = 600.0


def _over_time(client: PromClient, doc: dict, sels: dict[str, str], versions: dict[str, str], start: float,
               end: float, now: float, decided: str | None = None) -> list[h.Raw]:
    lead = UPGRADE_LEAD_S if doc.get("report_model") else 0.0
    start = start - lead
    spans, markers = _stage_overlays(doc, start, end)
    out: list[h.Raw] = []
    for panel in order_by_decision(OVER_TIME, decided, key=lambda p: p.metric):
        title = panel.title + (" (the metric the verdict rested on)" if decided and panel.metric == decided else "")
        rng = over_time_range(start, end, now, panel.window_s)
        queries = [(f"{track} {versions.get(track, '')}".strip(), tidy(panel.expr.format(sel=sel, w=panel.window)))
                   for track, sel in sels.items()]
        if rng is None:
            png = timeseries_png(title, panel.unit, [], markers, spans, xlim=(0.0, max(end - start, 1.0)),
                                 utc_origin=start, empty_note=f"the rollout lasted under one {panel.window} window")
            out.append(h.figure(png, "PromQL: " + "  |  ".join(q for _, q in queries), alt=title))
            continue
        got = fetch_lines(client, queries, rng[0], rng[1], step_for(rng[1] - rng[0]), origin=start)
        png = timeseries_png(title, panel.unit, got.lines, markers, spans, xlim=(0.0, max(end - start, 1.0)),
                             utc_origin=start)
        since = (f"{lead / 60:.0f} min before the upgrade (each node's own history)" if lead else
                 "the rollout started")
        out.append(h.figure(png, f"PromQL ({panel.window} window, first point {panel.window} after {since}): "
                                 + "  |  ".join(q for _, q in queries), alt=title))
        if got.notes:
            out.append(h.bullet_list(got.notes))
    return out


def _events(doc: dict) -> list[dict]:
    return [e for e in doc.get("events") or [] if isinstance(e, dict)]


def _compat_section(doc: dict) -> list[h.Raw]:
    """The compatibility gate's per-node table, then each distinct failing rule (``fix: ...``) and
    warning (``warning: ...``) with its message and source, as ``gpuobs rollout`` printed them (the last
    compat gate recorded; ``detail`` is ``FleetReport.to_dict()``, gpuobs.compat.inventory)."""
    gates = [g for g in doc.get("gates") or [] if isinstance(g, dict) and g.get("gate") == "compat"]
    if not gates:
        return []
    g = gates[-1]
    detail = g.get("detail") if isinstance(g.get("detail"), dict) else {}
    verdict = str(detail.get("verdict") or g.get("outcome") or "-")
    rows, notes = [], []
    for n in detail.get("nodes") or []:
        if not isinstance(n, dict):
            continue
        nv = str(n.get("verdict") or "-")
        rules = [r for r in n.get("rules") or [] if isinstance(r, dict)]
        by_status = {st: [str(r.get("rule", "?")) for r in rules if str(r.get("status", "")).lower() == st]
                     for st in ("fail", "warn")}
        failed = [str(x) for x in n.get("failed") or []] or by_status["fail"]
        warned = [str(x) for x in n.get("warned") or []] or by_status["warn"]
        said = "; ".join(p for p in (("fail: " + ", ".join(failed)) if failed else "",
                                     ("warn: " + ", ".join(warned)) if warned else "") if p)
        rows.append((n.get("hostname", "?"), n.get("gpus", "-"), n.get("gpu") or "-", n.get("driver") or "-",
                     h.badge(nv, "ok" if nv == "COMPATIBLE" else "bad" if nv in ("INCOMPATIBLE", "UNKNOWN")
                             else "warn"), said or ("see below" if n.get("error") else "-")))
        for r in rules:
            status = str(r.get("status", "")).lower()
            if status in ("fail", "warn"):
                prefix = "fix" if status == "fail" else "warning"
                note = f"{prefix}: {n.get('gpu') or '?'} / driver {n.get('driver') or '?'}: {r.get('rule', '?')}: " \
                       f"{r.get('message', '')}" + (f" [source: {r['source']}]" if r.get("source") else "")
                if note not in notes:
                    notes.append(note)
        if n.get("error") and f"fix: {n['error']}" not in notes:
            notes.append(f"fix: {n['error']}")
    rows += [(m, "0", "-", "-", h.badge("MISSING", "bad"), "no inventory series") for m in detail.get("missing") or []]
    release = f"{detail.get('release') or doc.get('version') or '?'} ({detail.get('engine') or '?'}, " \
              f"CUDA {detail.get('cuda') or '?'})"
    parts: list[h.Raw] = [
        h.paragraph(f"Release {release} at {h.utc(epoch(g.get('ts')))}: ",
                    h.badge(verdict, "ok" if verdict == "COMPATIBLE" else "bad" if verdict == "INCOMPATIBLE"
                            else "warn")),
        h.table(["node", "GPUs", "GPU", "driver", "verdict", "rules (failed, warned)"], rows, numeric=(1,)),
        h.bullet_list(notes, empty="")]
    return [h.section("Compatibility gate (what blocks the release, per node)", *parts)]


def _timeline(doc: dict) -> list[h.Raw]:
    """Transitions and operator decisions, oldest first, with UTC times."""
    rows = []
    for t in doc.get("transitions") or []:
        if isinstance(t, dict):
            st = t.get("stage")
            rows.append((epoch(t.get("ts")), "transition", f"{t.get('from_state') or '-'} -> {t.get('to_state')}",
                         f"{st + 1}/{stage_count(doc)}" if isinstance(st, int) and st >= 0 else "-",
                         t.get("reason") or "-"))
    for e in _events(doc):
        st = e.get("stage")
        rows.append((epoch(e.get("ts")), f"operator {e.get('kind', '?')}", e.get("operator") or "-",
                     f"{st + 1}/{stage_count(doc)}" if isinstance(st, int) and st >= 0 else "-",
                     e.get("reason") or "-"))
    if not rows:
        return []
    rows.sort(key=lambda r: (r[0] is None, r[0] or 0.0))
    return [h.section("Timeline (UTC)", h.table(["time (UTC)", "event", "what / who", "stage", "reason"],
                                                [(h.utc(r[0]), *r[1:]) for r in rows]))]


def _header(doc: dict, start: float, end: float, sels: dict[str, str]) -> list[h.Raw]:
    state = str(doc.get("state", "unknown"))
    summary = h.kv_table([
        ("rollout", doc.get("rollout_id", "rollout")),
        ("canary version", doc.get("version") or "-"),
        ("baseline version", baseline_version(doc) or "not recorded"),
        ("state", h.badge(state, _STATE_KIND.get(state, "info"))), ("reason", doc.get("reason") or "-"),
        *[("assumption", a) for a in assumptions_of(doc)],
        ("started", h.utc(start)), ("ended", h.utc(end) if state in _STATE_KIND else "- (not ended)"),
        ("duration", _duration(end - start)),
        *([("GPU model plotted", f"{doc['report_model']} (a driver upgrade: its upgraded nodes against the "
                                 "nodes its verdict compared them with)")] if doc.get("report_model") else []),
        ("canary selector", h.Raw(f"<code>{h.esc(sels['canary'])}</code>")),
        ("baseline selector", h.Raw(f"<code>{h.esc(sels['baseline'])}</code>")),
        ("Prometheus", doc.get("prometheus") or "-"),
    ])
    stage_rows = []
    all_stages, total = _stages(doc), stage_count(doc)
    for i, st in enumerate(all_stages):
        s0, s1 = epoch(st.get("started_at")), epoch(st.get("ended_at"))
        nodes = st.get("nodes", st.get("hosts")) or []
        verdict = str(st.get("verdict") or "-")
        stage_rows.append((f"{_stage_no(st, i)}/{total}", st.get("share", "-"),
                           ", ".join(map(str, nodes)) if isinstance(nodes, list) else str(nodes),
                           h.utc(s0), h.utc(s1), _duration(s1 - s0) if s0 is not None and s1 is not None else "-",
                           h.badge(verdict, _VERDICT_KIND.get(verdict, "info"))))
    fv = doc.get("final_verdict") if isinstance(doc.get("final_verdict"), dict) else {}
    verdict = str(fv.get("verdict") or "-")
    metrics = h.table(["metric", "class", "baseline", "canary", "effect", "interval", "evidence", "critical"],
                      verdict_rows(fv.get("metrics") or []), numeric=(4,))
    compat = _compat_section(doc)
    first = compat if state == "Rejected" else []
    return [h.section("Summary", summary), *first,
            h.section("Stages", h.table(["stage", "share", "nodes", "started (UTC)", "ended (UTC)", "duration",
                                         "verdict"], stage_rows)),
            *([] if first else compat), *_timeline(doc),
            h.section("Final verdict", h.paragraph("Verdict: ", h.badge(verdict, _VERDICT_KIND.get(verdict, "info"))),
                      metrics, h.bullet_list([f"reason: {r}" for r in fv.get("reasons") or []]
                                             + [f"warning: {w}" for w in fv.get("warnings") or []], empty=""))]


def assumptions_of(doc: dict) -> list[str]:
    """The rollout's assumptions, each once: ``doc["assumptions"]``, else the final verdict's (a
    document written before the rollout report collected them); ``[]`` when none."""
    fv = doc.get("final_verdict") if isinstance(doc.get("final_verdict"), dict) else {}
    got = doc.get("assumptions") if isinstance(doc.get("assumptions"), list) else fv.get("assumptions")
    return [str(a) for a in got] if isinstance(got, list) else []


def _duration(seconds: float) -> str:
    """``42 s`` under two minutes, else ``3.5 min``."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _stage_no(st: dict, i: int) -> int:
    """1-based stage number as the controller prints it (``stage 1/3``); ``index`` is 0-based."""
    idx = st.get("index", i)
    return (idx if isinstance(idx, int) else i) + 1


def write_rollout_report(doc: dict, out_dir: Path, *, client: PromClient | None = None, strict: bool = False,
                         now: float | None = None) -> Path:
    """Write ``rollout-<rollout_id>.html`` into ``out_dir`` and return its path.

    ``doc`` follows the module's input contract. Without a Prometheus URL, or when Prometheus cannot
    answer and ``strict`` is false (the controller's case: the report must exist even if Prometheus
    went away), the report has the tables and a note instead of the plots. With ``strict`` the
    Prometheus error propagates (PrometheusUnavailable / PrometheusResponseError) and nothing is
    written. Raises ValueError when ``doc`` is not a dict or the URL is not http(s).
    """
    if not isinstance(doc, dict):
        raise ValueError("a rollout document must be a JSON object")
    start, end = rollout_window(doc, now)
    sels = {"canary": _selector(doc.get("canary_selector"), 'track="canary"'),
            "baseline": _selector(doc.get("baseline_selector"), 'track="baseline"')}
    versions = {"canary": str(doc.get("version") or ""), "baseline": baseline_version(doc) or ""}
    sections = _header(doc, start, end, sels)
    url = doc.get("prometheus")
    if client is None and url:
        client = client_for(str(url))
    if not _stages(doc):
        # Rejected by a gate before any deploy: there is no canary traffic to plot; the reason
        # (with the gate's verdict) is in the header.
        sections.append(h.section("Plots", "No stage ran (nothing was deployed): no canary traffic to plot."))
    elif client is None:
        sections.append(h.section("Plots", "No Prometheus URL in the rollout document: plots omitted."))
    else:
        try:
            decided = deciding_metric(doc)
            dists = _distributions(client, sels, versions, start, end, decided)
            timeline = _over_time(client, doc, sels, versions, start, end, time.time() if now is None else now,
                                  decided)
        except PrometheusError as exc:
            if strict:
                raise
            sections.append(h.section("Plots", f"Prometheus could not answer ({exc}): plots omitted."))
        else:
            why = h.paragraph(f"The verdict rested on {decided}: its panels come first." if decided else
                              "No deciding metric recorded in the final verdict.")
            sections.append(h.section("Over time, canary vs baseline (shaded: stages; dashed: stage boundaries; "
                                      f"latency quantiles over {QUANTILE_WINDOW} windows, rates over {RATE_WINDOW})",
                                      why, *timeline))
            sections.append(h.section("Canary vs baseline: distributions over the rollout", *dists))
    rid = str(doc.get("rollout_id") or "rollout")
    state = str(doc.get("state", "unknown"))
    against = versions["baseline"] or "an unrecorded baseline version"
    subtitle = h.join([h.badge(state, _STATE_KIND.get(state, "info")), f" {versions['canary'] or '(no version)'} "
                       f"against {against}, {h.utc(start)} .. {h.utc(end) if state in _STATE_KIND else 'now'}"])
    kind = "Driver upgrade report" if (doc.get("spec") or {}).get("engine", "").startswith("NVIDIA driver") \
        else "Rollout report"
    text = h.page(f"{kind}: {rid} - {state}", subtitle, sections, time.time() if now is None else now)
    out_dir = Path(out_dir)
    path = out_dir / f"rollout-{re.sub(r'[^A-Za-z0-9_.-]+', '_', rid)[:80] or 'rollout'}.html"
    atomic_write(path, text)  # creates out_dir; readers never see half a report
    return path
