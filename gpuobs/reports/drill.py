"""The drill report: what the fault did to the GPU's metrics, and when each alert hop happened.

Input is a saved drill result (``DrillResult.to_dict()``, see :mod:`gpuobs.drills.runner`): drill name,
hostname, faults (admin-API bodies, with ``gpu`` for per-GPU kinds), per-alert times in seconds since
injection, ``injected_at`` (epoch s), ``cleared_s``, false alerts and problems. For the drill's fault,
the drill catalogue's panels (:data:`gpuobs.drills.catalogue.PANELS`) name the metrics that fault moves; each is fetched from Prometheus over a window from
:data:`BEFORE_S` before the injection to shortly after the last alert resolved (or now, at most
:data:`MAX_AFTER_S` after the injection), scoped to the drill's node (identity label ``node``) and ``gpu``, and
plotted with vertical lines at injected, firing, paged (ticketed), cleared and resolved.

Which panels: :func:`order_panels` puts first the panels of the alerts that actually reached a receiver
(``Panel.pages_with``: the kernel-log Xid counter ``gpuobs_xid_events_total`` when
``GpuKernelXidCritical`` paged, as on a stack whose nodes run logwatch; DCGM's
``DCGM_EXP_XID_ERRORS_COUNT`` when ``GpuXidCritical`` did). A panel none of whose queries returns a
series over the window is not plotted (an empty plot reads as "the metric stayed flat"): it is listed
as "not on this profile", since its metric is not exported by this stack's exporter profile (e.g.
``DCGM_FI_DEV_THERMAL_VIOLATION`` outside the ``recommended`` one) or its path is not the one that ran.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from string import Template

from gpuobs.core.files import atomic_write
from gpuobs.core.fleet import FleetConfig, shipped_fleet
from gpuobs.drills.catalogue import Panel, panels_for
from gpuobs.promapi.prometheus import PromClient
from gpuobs.reports import html as h
from gpuobs.reports.plots import Marker, timeseries_png
from gpuobs.reports.query import client_for, fetch_lines, matchers, step_for, tidy

BEFORE_S = 120.0
AFTER_RESOLVED_S = 30.0
MAX_AFTER_S = 6 * 3600.0
RATE_WINDOW = "1m"


def _fault_gpu(result: dict) -> str | None:
    for fault in result.get("faults") or ():
        if fault.get("gpu") is not None:
            return str(fault["gpu"])
    return None


def selectors(result: dict, identity_label: str) -> dict[str, str]:
    """Template values scoping the queries to the drill's host (and GPU) by the fleet config's
    ``identity_label``; empty for fleet drills."""
    host = result.get("hostname")
    if not host or host == "fleet":
        return {"gpu": "", "host": "", "w": RATE_WINDOW}
    return {"gpu": matchers(**{identity_label: host}, gpu=_fault_gpu(result)),
            "host": matchers(**{identity_label: host}), "w": RATE_WINDOW}


def window(result: dict, now: float | None = None) -> tuple[float, float]:
    """[start, end] epoch seconds: BEFORE_S before injection to the resolution + AFTER_RESOLVED_S, or now."""
    now = time.time() if now is None else now
    t0 = float(result.get("injected_at") or now)
    alerts = result.get("alerts") or []
    resolved = [a.get("resolved_s") for a in alerts]
    if alerts and all(r is not None for r in resolved):
        end = t0 + max([*resolved, result.get("cleared_s") or 0.0]) + AFTER_RESOLVED_S
    else:
        end = now
    end = min(end, now, t0 + MAX_AFTER_S)
    return t0 - BEFORE_S, max(end, t0 + 10.0)


def delivered_verb(alert: dict) -> str:
    """``ticketed`` for an alert that reached (else was expected at) the ticket receiver, else ``paged``."""
    return "ticketed" if (alert.get("receiver") or alert.get("expected_receiver")) == "ticket" else "paged"


def order_panels(panels: tuple[Panel, ...] | list[Panel], result: dict) -> list[Panel]:
    """``panels`` with those showing an alert that reached a receiver (``paged_s`` set) first, then
    those of an expected alert that did not, then the rest; catalogue order within each group."""
    alerts = result.get("alerts") or []
    paged = {a.get("alertname") for a in alerts if a.get("paged_s") is not None}
    expected = {a.get("alertname") for a in alerts}

    def rank(p: Panel) -> int:
        return 0 if p.pages_with & paged else 1 if p.pages_with & expected else 2
    return sorted(panels, key=rank)  # stable


def timeline(result: dict) -> list[tuple[str, str, float]]:
    """``(kind, label, seconds since injection)`` for every known event, in time order. An alert's
    delivery has kind ``paged`` and reads ``ticketed`` for a ticket (:func:`delivered_verb`)."""
    events: list[tuple[str, str, float]] = [("injected", "fault injected", 0.0)]
    for a in result.get("alerts") or []:
        name = a.get("alertname", "?")
        for kind, key in (("firing", "fired_s"), ("paged", "paged_s"), ("resolved", "resolved_s")):
            if a.get(key) is not None:
                verb = delivered_verb(a) if kind == "paged" else kind
                what = f"{verb} {name}" + (f" -> {a.get('receiver')}" if kind == "paged" else "")
                events.append((kind, what, float(a[key])))
    if result.get("cleared_s") is not None:
        events.append(("cleared", "fault cleared", float(result["cleared_s"])))
    return sorted(events, key=lambda e: e[2])


def passed(result: dict) -> bool:
    """The drill's verdict: ``ok`` if saved, else no problems and no false alerts."""
    if "ok" in result:
        return bool(result["ok"])
    return not result.get("problems") and not result.get("unexpected")


def _hop(a: float | None, b: float | None) -> str:
    return h.seconds(b - a) if a is not None and b is not None else "-"


def _header(result: dict, prometheus_url: str, start: float, end: float) -> list[h.Raw]:
    about = ""
    try:
        from gpuobs.drills.catalogue import DRILLS

        about = DRILLS[result["drill"]].about if result.get("drill") in DRILLS else ""
    except ImportError:  # pragma: no cover - the report works without the stack package
        pass
    alerts = result.get("alerts") or []
    t0 = result.get("injected_at")
    cleared = result.get("cleared_s")
    faults = result.get("faults") or []
    summary = h.kv_table([
        ("drill", result.get("drill", "?")), ("what it tests", about or "-"),
        ("host", result.get("hostname", "?")), ("rule profile", result.get("profile", "-")),
        ("faults", h.join([h.Raw(f"<code>{h.esc(json.dumps(f, sort_keys=True))}</code>")
                           for f in faults], "<br>") if faults else "-"),
        ("expected alerts", ", ".join(f"{a.get('alertname')} -> {a.get('expected_receiver')}" for a in alerts) or "-"),
        ("injected at", h.utc(t0)), ("plotted window", f"{h.utc(start)} .. {h.utc(end)}"),
        ("Prometheus", prometheus_url),
    ])
    events = h.table(["event", "seconds since injection", "time (UTC)"],
                     [(label, h.seconds(s), h.utc(t0 + s if t0 else None)) for _, label, s in timeline(result)],
                     numeric=(1,))
    hops = h.table(
        ["alert", "expected receiver", "receiver", "fault -> firing", "firing -> paged/ticketed",
         "fault -> paged/ticketed", "cleared -> resolved", "runbook"],
        [(a.get("alertname"), a.get("expected_receiver"),
          h.badge(a.get("receiver") or "none", "ok" if a.get("receiver") == a.get("expected_receiver") else "bad"),
          h.seconds(a.get("fired_s")), _hop(a.get("fired_s"), a.get("paged_s")), h.seconds(a.get("paged_s")),
          _hop(cleared, a.get("resolved_s")), h.link(a.get("runbook_url")))
         for a in alerts], numeric=(3, 4, 5, 6))
    imp = result.get("impact") or {}
    impact = (h.join([h.Raw(f"<p>Incident #{h.esc(imp.get('incident', '?'))}: {h.esc(imp['line'])}</p>"),
                      h.kv_table([(k, h.Raw(f"<code>{h.esc(v)}</code>")) for k, v in sorted((imp.get("queries") or {}).items())])])
              if "line" in imp else h.Raw(f"<p>Not measured: {h.esc(imp.get('error', 'no incident found'))}</p>"))
    return [h.section("Summary", summary),
            h.section("What it cost (the incident's impact, measured by the pager; docs/incidents.md)", impact),
            h.section("Timeline", events),
            h.section("Per-hop latencies", hops),
            h.section("False alerts (fired during the drill, neither expected nor inhibited)",
                      h.bullet_list(result.get("unexpected") or [])),
            h.section("Problems", h.bullet_list(result.get("problems") or []))]


def _markers(result: dict) -> list[Marker]:
    multi = len(result.get("alerts") or []) > 1
    out = []
    for kind, label, s in timeline(result):
        short = label if multi or kind in ("injected", "cleared") else label.split(" ", 1)[0]
        out.append(Marker(s, f"{short} (+{s:.0f} s)" if s else short, kind))
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "drill"


def write_drill_report(result: dict, prometheus_url: str, out_dir: Path, *, client: PromClient | None = None,
                       now: float | None = None, fleet: FleetConfig | None = None) -> Path:
    """Write ``drill-<name>-<injected epoch>.html`` into ``out_dir`` and return its path.

    ``result`` is a saved ``DrillResult.to_dict()``; missing optional keys are tolerated. Raises
    ValueError for a non-http(s) ``prometheus_url``, and PrometheusUnavailable /
    PrometheusResponseError when Prometheus cannot answer (nothing is written then); a query it
    rejects only leaves a note under that panel. ``fleet``: the fleet config of the stack the drill ran
    on (default: the shipped one), whose identity label scopes the queries. ``client`` and ``now`` are
    for tests.
    """
    if not isinstance(result, dict):
        raise ValueError("a drill result must be a JSON object")
    client = client or client_for(prometheus_url)
    start, end = window(result, now)
    t0 = float(result.get("injected_at") or start + BEFORE_S)
    step = step_for(end - start)
    values = selectors(result, (fleet or shipped_fleet()).identity_label)
    markers = _markers(result)
    figures: list[h.Raw] = []
    absent: list[str] = []
    for panel in order_panels(panels_for(result), result):
        queries = [(legend, tidy(Template(expr).substitute(values))) for legend, expr in panel.queries]
        got = fetch_lines(client, queries, start, end, step, origin=t0)
        if not got.lines:
            rejected = [n for n in got.notes if not n.startswith("no data: ")]
            if rejected:  # a query error is said as such, under the panel's title
                figures.append(h.bullet_list([f"{panel.title}: not plotted; {n}" for n in rejected]))
            else:
                absent.append(f"{panel.title}: not on this profile (no series in the plotted window for "
                              + "  |  ".join(q for _, q in queries) + ")")
            continue
        png = timeseries_png(panel.title, panel.unit, got.lines, markers, xlim=(start - t0, end - t0))
        caption = "PromQL: " + "  |  ".join(q for _, q in queries)
        figures.append(h.figure(png, caption, alt=panel.title))
        if got.notes:
            figures.append(h.bullet_list(got.notes))
    ok = passed(result)
    verdict = "PASS" if ok else "FAIL"
    name = str(result.get("drill", "drill"))
    subtitle = h.join([h.badge(verdict, "ok" if ok else "bad"), " drill ", name, " on ",
                       str(result.get("hostname", "?")), ", injected ", h.utc(result.get("injected_at"))])
    sections = [*_header(result, prometheus_url, start, end),
                h.section("What the fault did (vertical lines: injected, firing, paged, cleared, resolved)",
                          *figures),
                h.section("Not on this profile (no series on this stack; not plotted)", h.bullet_list(absent))]
    doc = h.page(f"Drill report: {name} - {verdict}", subtitle, sections, time.time() if now is None else now)
    out_dir = Path(out_dir)
    path = out_dir / f"drill-{_safe(name)}-{int(t0)}.html"
    atomic_write(path, doc)  # creates out_dir; readers never see half a report
    return path
