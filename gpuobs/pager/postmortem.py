"""Blameless postmortem drafts from an incident (``gpuobs incident postmortem ID``).

Follows ``runbooks/postmortem-template.md``: the header table (incident id, date, severity, alerts,
detection, duration, time to detect/page, acknowledge, resolve), the timeline built from the
pager's recorded timeline (not from memory), what fired, the runbook linked from the alert, and
the metrics around the fault as plots; the narrative sections (summary, impact, contributing causes,
action items) are left as the template's prompts for people to fill in.

Metrics: for every alert of the incident, its rule expression is read from Prometheus
(``GET /api/v1/rules?type=alert``, prometheus v2.42 ``web/api/v1/api.go``) and evaluated over the
incident window plus 10 minutes either side (``query_range``); only series whose labels agree with
the alert's are plotted (absolute UTC time; opened / acknowledged / resolved marked; the y axis
includes 0 for non-negative data). Without Prometheus the draft says so and has no plots.

Output: ``<out>/postmortem-incident-<id>.md``, ``.html`` (Python-Markdown, images embedded) and one
PNG per plotted alert. Raises :class:`PostmortemError` (exit 1) when the output cannot be written.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from pathlib import Path

from gpuobs.core.errors import Failure
from gpuobs.core.files import atomic_write

#: Seconds of context plotted before the incident opened and after it resolved (or now).
MARGIN_S = 600.0


class PostmortemError(Failure):
    """The draft could not be written."""


def _utc(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _rfc3339(text: str) -> float | None:
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return None if t.year < 1970 else t.timestamp()


def _dur(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


def measures(inc: dict) -> dict[str, float | None]:
    """Seconds: ``detect`` (earliest alert ``startsAt`` -> first notification received), ``ack``
    (opened -> acknowledged), ``resolve`` (opened -> resolved), ``duration`` (earliest ``startsAt`` ->
    resolved)."""
    starts = [t for t in (_rfc3339(a["startsAt"]) for a in inc["alerts"]) if t is not None]
    first_start = min(starts) if starts else None
    notified = [e["at"] for e in inc["timeline"] if e["kind"] == "notified"]
    first_notified = min(notified) if notified else None
    opened, acked, resolved = inc["opened_at"], inc["acknowledged_at"], inc["resolved_at"]
    acks = [e["at"] for e in inc["timeline"] if e["kind"] == "acknowledged"]
    ack_at = min(acks) if acks else acked
    return {
        "detect": first_notified - first_start if first_notified and first_start else None,
        "ack": ack_at - opened if ack_at else None,
        "resolve": resolved - opened if resolved else None,
        "duration": resolved - first_start if resolved and first_start else None,
        "first_start": first_start,
    }


def _alert_rules(prom_url: str, timeout_s: float = 10.0) -> dict[str, str]:
    """alertname -> expression, from Prometheus's rules API. Raises requests/ValueError errors."""
    import requests

    resp = requests.get(f"{prom_url.rstrip('/')}/api/v1/rules", params={"type": "alert"}, timeout=timeout_s)
    resp.raise_for_status()
    out: dict[str, str] = {}
    for g in resp.json()["data"]["groups"]:
        for r in g["rules"]:
            if r.get("type") == "alerting":
                out.setdefault(r["name"], r["query"])
    return out


def _agrees(series_labels: dict[str, str], alert_labels: dict[str, str]) -> bool:
    return all(alert_labels[k] == v for k, v in series_labels.items() if k in alert_labels)


def plots(inc: dict, prom_url: str, out: Path, now: float) -> tuple[list[tuple[str, str, Path]], str | None]:
    """One PNG per alert name: ``([(alertname, expr, png path)], error or None)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    from gpuobs.core.reach import is_connection_error, unreachable
    from gpuobs.promapi.prometheus import PromClient, PrometheusError

    try:
        rules = _alert_rules(prom_url)
    except Exception as exc:  # noqa: BLE001 (unreachable, not Prometheus: the draft says so)
        if is_connection_error(exc):
            return [], unreachable("Prometheus", prom_url, exc)
        return [], f"Prometheus {prom_url} rules API: {str(exc)[:300]}"
    m = measures(inc)
    start = min(x for x in (m["first_start"], inc["opened_at"]) if x) - MARGIN_S
    end = (inc["resolved_at"] or now) + MARGIN_S
    end = min(end, now) if end > now else end
    step = max(15.0, (end - start) / 240)
    client = PromClient(prom_url, timeout=10, retries=1)
    made, errors = [], []
    for name in sorted({a["labels"]["alertname"] for a in inc["alerts"]}):
        expr = rules.get(name)
        if not expr:
            errors.append(f"{name}: no alerting rule of that name in Prometheus")
            continue
        try:
            res = client.query_range(expr, start, end, step)
        except (PrometheusError, ValueError) as exc:
            errors.append(f"{name}: {str(exc)[:200]}")
            continue
        labels = [a["labels"] for a in inc["alerts"] if a["labels"]["alertname"] == name]
        series = [s for s in res.series if any(_agrees(dict(s.labels), lab) for lab in labels)][:8]
        if not series:
            errors.append(f"{name}: the rule's expression returned no series matching the alert in the window")
            continue
        fig, ax = plt.subplots(figsize=(9, 3.4))
        styles = ["-", "--", "-.", ":"]
        ys: list[float] = []
        for i, s in enumerate(series):
            pts = list(zip(s.timestamps, s.values))
            ys += [v for _, v in pts]
            key = ",".join(f"{k}={v}" for k, v in sorted(dict(s.labels).items())
                           if k in ("Hostname", "node", "gpu", "xid", "slo", "model_name", "rank"))
            ax.plot([dt.datetime.fromtimestamp(t, dt.timezone.utc) for t, _ in pts], [v for _, v in pts],
                    linestyle=styles[i % 4], color=f"C{i % 10}", label=key or f"series {i + 1}")
        for ts, what, colour in ((inc["opened_at"], "opened", "#b00000"), (inc["acknowledged_at"], "acknowledged",
                                                                            "#b06000"),
                                 (inc["resolved_at"], "resolved", "#007000")):
            if ts:
                ax.axvline(dt.datetime.fromtimestamp(ts, dt.timezone.utc), color=colour, linestyle=(0, (1, 1)),
                           linewidth=1.2, label=what)
        if ys and min(ys) >= 0:
            ax.set_ylim(bottom=0, top=max(max(ys) * 1.1, 1e-9))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=dt.timezone.utc))
        ax.set_xlabel("UTC")
        ax.set_title(f"{name}: the alert's expression", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        png = out / f"postmortem-incident-{inc['id']}-{name}.png"
        fig.savefig(png, dpi=90)
        plt.close(fig)
        made.append((name, expr, png))
    return made, ("; ".join(errors) or None)


def impact_section(inc: dict, m: dict) -> list[str]:
    """The draft's Impact section: the pager's last measurement (:mod:`gpuobs.pager.impact`) with each
    number and the PromQL that gives it, or the prompt to fill it when there is none."""
    imp = inc.get("impact") or {}
    head = ["## Impact", ""]
    if "line" not in imp:
        why = f" (the pager could not measure it: {imp['error']})" if imp.get("error") else ""
        return head + [f"_Not measured{why}. Fill from the SLO queries of runbooks/postmortem-template.md for the "
                       f"window {_utc(m['first_start'] or inc['opened_at'])} - {_utc(inc['resolved_at'])} UTC._", ""]
    w = imp["window"]
    out = head + [f"{imp['line']}", "",
                  f"Measured by the pager from Prometheus at {_utc(imp['measured_at'])} over {_utc(w['start'])} - "
                  f"{_utc(w['end'])} UTC ({w['seconds']:.0f} s); baseline: each node's own {imp['baseline_s']:.0f} s "
                  f"before; workloads joined by {imp['join']}."
                  + (f" The last measurement failed: {imp['error']}." if imp.get("error") else ""), ""]
    if imp.get("serving"):
        out += ["| Serving engine | Requests | Failed (above baseline) | Over TTFT SLO (above baseline) | Goodput lost |",
                "|---|---|---|---|---|"]
        out += [f"| {e.get('model_name', '')} on {e.get('instance', '')} | {e['requests']} | {e['failed']} "
                f"({e['failed_excess']}) | {e['over_ttft_slo']} ({e['over_ttft_slo_excess']}) | {e['goodput_lost']} "
                f"requests ({e['goodput_lost_per_s']} req/s) |" for e in imp["serving"]]
        out.append("")
    if imp.get("training"):
        out += ["| Training job | GPUs | Ranks stalled | Stalled (s) | GPU-hours lost |", "|---|---|---|---|---|"]
        out += [f"| {t['training_job']} | {t['gpus']} | {t['ranks_stalled']} | {t['stalled_s']} | {t['gpu_hours_lost']} |"
                for t in imp["training"]]
        out.append("")
    f = imp.get("fleet") or {}
    if f:
        out += [f"Capacity out: {f['gpus_out']} of {f['gpus_total']} GPUs.", ""]
    out += [f"PromQL (evaluate at {imp.get('evaluated_at', '')}; `increase()` extrapolates to the window's edges, "
            "the pager's numbers difference the raw samples):", ""]
    out += [f"- {k}: `{v}`" for k, v in sorted(imp["queries"].items())]
    return out + [""]


def markdown_draft(inc: dict, plotted: list[tuple[str, str, Path]], metrics_note: str | None,
                   runbook_base: str | None = None) -> str:
    """The draft as Markdown (the template's structure; facts filled in, narrative left as prompts)."""
    m = measures(inc)
    fired = ", ".join(sorted({"`{}{{{}}}`".format(
        a["labels"]["alertname"], ",".join(f'{k}="{v}"' for k, v in sorted(a["labels"].items())
                                           if k in ("severity", "Hostname", "node", "gpu", "xid", "slo")))
        for a in inc["alerts"]}))
    title = f"{', '.join(inc['alertnames'])} on {', '.join(inc['nodes']) or 'the fleet'}"
    rows = [
        ("Incident ID / ticket", f"gpuobs incident #{inc['id']} ({inc['channel']})"),
        ("Date (UTC)", _utc(inc["opened_at"])),
        ("Authors", ""),
        ("Status", "draft"),
        ("Severity", f"{inc['channel']} ({inc['severity']})"),
        ("Nodes / GPUs / Xid", f"{', '.join(inc['nodes']) or '-'} / {', '.join(inc['gpus']) or '-'} / "
                               f"{', '.join(inc['xids']) or '-'}"),
        ("Alerts that fired", fired),
        ("Detection", "alert"),
        ("Duration (first firing -> resolved)", _dur(m["duration"])),
        ("Time to page (first firing -> first notification)", _dur(m["detect"])),
        ("Time to acknowledge (opened -> acknowledged)", _dur(m["ack"])),
        ("Time to resolve (opened -> resolved)", _dur(m["resolve"])),
        ("State when drafted", inc["state"]),
    ]
    md = [f"# Postmortem: {title}", "",
          "> Blameless. This document explains how the system and our processes allowed the incident, not who",
          "> made a mistake. Draft generated by `gpuobs incident postmortem` from the pager's recorded timeline",
          "> and Prometheus; the narrative sections are for the people involved to write.", "",
          "| Field | Value |", "|---|---|"]
    md += [f"| {k} | {v.replace('|', '/')} |" for k, v in rows]
    md += ["", "## Summary", "", *(f"- {d}" for d in inc["descriptions"]), "",
           "_To write: what users experienced, for how long, the cause in one line, how it was fixed._", "",
           *impact_section(inc, m),
           "## Timeline (UTC)", "", "| Time | Source | Event |", "|---|---|---|"]
    # One table in time order: the alerts' own start times (Prometheus) and the pager's timeline rows. An
    # alert names its node by whichever label carries one of the incident's nodes (the fleet's identity).
    nodes = set(inc.get("nodes") or [])
    rows_t: list[tuple[float, str, str]] = []
    for a in inc["alerts"]:
        t = _rfc3339(a["startsAt"])
        if t:
            named = ", ".join(f"{k}={v}" for k, v in sorted(a["labels"].items()) if k in ("gpu", "xid") or v in nodes)
            rows_t.append((t, "Prometheus", f"{a['labels']['alertname']} started firing ({named})"))
    for e in inc["timeline"]:
        what = {"notified": lambda e: f"{e.get('status')} notification ({', '.join(e.get('alerts', []))}; "
                                      f"{e.get('firing')} firing) to {e.get('receiver')}",
                "acknowledged": lambda e: f"acknowledged by {e.get('by')}",
                "silenced": lambda e: f"silence {e.get('silence')} by {e.get('by')} until {e.get('endsAt')}: "
                                      f"{e.get('comment')}",
                "silence_expired": lambda e: f"silence {e.get('silence')} expired by {e.get('by')}",
                "escalated": lambda e: f"escalated to {e.get('receiver')}"}.get(
            e["kind"], lambda e: (f"{e['kind']}: {e.get('title')} on {e.get('on')} (related by {e.get('match')})"
                                  + (f", {e['outcome']}" if e.get("outcome") else "")) if e.get("title")
            else e["kind"])(e)
        source = e["kind"].split()[0] if e.get("title") else "pager"  # drill / rollout rows: gpuobs.core.activity
        rows_t.append((e["at"], source, str(what)))
    md += [f"| {_utc(t)} | {source} | {text.replace('|', '/')} |"
           for t, source, text in sorted(rows_t, key=lambda r: r[0])]
    md += ["", "## Detection and response", "",
           f"- Alerts: {fired}; severity {inc['severity']} routed to the {inc['channel']} receiver.",
           f"- Time to page {_dur(m['detect'])}, to acknowledge {_dur(m['ack'])}, to resolve {_dur(m['resolve'])}.",
           f"- Runbook linked from the alert: {inc['runbook_url'] or 'none'}. Did it lead to the cause and the fix?",
           "", "### Metrics around the fault", ""]
    if metrics_note:
        md += [f"_Not all metrics could be plotted: {metrics_note}_", ""]
    for name, expr, png in plotted:
        md += [f"**{name}** (`{expr.strip().replace(chr(10), ' ')[:400]}`)", "", f"![{name}]({png.name})", ""]
    md += ["## Contributing causes", "", "1. Trigger: ...", "2. Latent condition: ...", "3. Detection gap: ...",
           "4. Mitigation delay: ...", "", "## What went well", "", "- ...", "",
           "## What went poorly / where we got lucky", "", "- ...", "", "## Action items", "",
           "| # | Action | Type (prevent / detect / mitigate / process) | Owner | Due | Ticket |",
           "|---|---|---|---|---|---|",
           "| 1 | Update the runbook(s) used during the incident with what was missing | detect | | | |",
           "| 2 | Add or adjust a drill (`gpuobs drill <name>`) that reproduces this failure | detect | | | |", "",
           "## Supporting material", "", f"- Pager: `GET /api/incidents/{inc['id']}` (timeline, alerts, silences).", ""]
    return "\n".join(md)


def _no_raw_html(md: str) -> str:
    """``md`` with every ``<`` outside code spans escaped: Python-Markdown passes raw HTML through, and
    labels, descriptions, notes and the impact line are other people's text (code spans it escapes itself)."""
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;")
                   for part in re.split(r"(`[^`\n]*`)", md))


def write(inc: dict, out: Path, prom_url: str | None, now: float) -> tuple[Path, Path, str | None]:
    """Write the Markdown and HTML drafts (and PNGs) into ``out``; returns ``(md, html, metrics note)``."""
    import markdown

    try:
        out.mkdir(parents=True, exist_ok=True)
        if prom_url:
            plotted, note = plots(inc, prom_url, out, now)
        else:
            plotted, note = [], "no Prometheus URL given"
        md = markdown_draft(inc, plotted, note)
        md_path = out / f"postmortem-incident-{inc['id']}.md"
        atomic_write(md_path, md)
        body = markdown.markdown(_no_raw_html(md), extensions=["tables"], output_format="html")
        for _, _, png in plotted:  # self-contained HTML: images inline
            uri = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
            body = body.replace(f'src="{png.name}"', f'src="{uri}"')
        html_doc = ("<!doctype html><html><head><meta charset=\"utf-8\"><title>"
                    f"{re.sub(r'[<>&]', '', md.splitlines()[0].lstrip('# '))}</title><style>body{{font-family:sans-serif;"
                    "max-width:64rem;margin:1rem auto}td,th{border:1px solid #ccc;padding:3px 6px}"
                    "table{border-collapse:collapse}img{max-width:100%}</style></head><body>"
                    f"{body}</body></html>")
        html_path = out / f"postmortem-incident-{inc['id']}.html"
        atomic_write(html_path, html_doc)
    except OSError as exc:
        raise PostmortemError(f"cannot write the postmortem draft in {out}: {exc}") from None
    return md_path, html_path, note
