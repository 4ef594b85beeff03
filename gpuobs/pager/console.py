"""HTML views of the incident console (server-rendered; every value escaped; no JavaScript, no refresh).

* :func:`index`: open count, then pages and tickets in separate sections; per incident the state,
  severity, node, GPU, Xid code, the templated ``description`` and an Acknowledge button (a plain
  form POST, so it works without JavaScript).
* :func:`incident`: one incident: identity, descriptions, runbook link, alerts, silences (with a
  form to create one and buttons to expire), timeline.
"""

from __future__ import annotations

import datetime as dt
import html
from typing import Any, Callable

_CSS = ("body{font-family:sans-serif;margin:1rem}td,th{padding:4px 8px;border-bottom:1px solid #ddd;"
        "text-align:left;vertical-align:top}.open{color:#b00;font-weight:bold}.acknowledged{color:#b60}"
        ".resolved{color:#070}.sev-critical{background:#fdd}.sev-warning{background:#ffd}.desc{max-width:40rem}"
        "form.inline{display:inline}.count{font-size:1.3rem}")


def utc(ts: float | None) -> str:
    """Epoch seconds -> ``2026-12-01 17:00:00Z`` (empty for None)."""
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _e(v: Any) -> str:
    return html.escape(str(v))


def _doc(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
            f"<style>{_CSS}</style></head><body>{body}</body></html>")


def _runbook(inc: dict, safe_url: Callable[[str], str | None]) -> str:
    raw = inc.get("runbook_url", "")
    url = safe_url(raw) if raw else None
    if url:
        return f'<a href="{_e(url)}">runbook</a>'
    return f"<code>{_e(raw[:200])}</code> (not under the runbook base)" if raw else ""


def _ack_button(inc: dict) -> str:
    if inc["state"] != "open":
        return ""
    # who acknowledges: the name typed here (the silence form's Author, the CLI's --author); empty: "console"
    return (f'<form class="inline" method="post" action="/incidents/{inc["id"]}/ack">'
            '<input name="by" size="10" maxlength="100" placeholder="your name" aria-label="acknowledged by"> '
            f'<button type="submit" name="ack" value="{inc["id"]}">Acknowledge</button></form>')


def _rows(incs: list[dict], safe_url: Callable[[str], str | None]) -> str:
    rows = []
    for i in incs:
        rows.append(
            f'<tr class="sev-{_e(i["severity"])}" id="incident-{i["id"]}">'
            f'<td><a href="/incidents/{i["id"]}">#{i["id"]}</a></td>'
            f'<td class="{_e(i["state"])} state">{_e(i["state"])}</td><td>{_e(i["severity"])}</td>'
            f'<td>{_e(", ".join(i["alertnames"]))}</td><td class="node">{_e(", ".join(i["nodes"]))}</td>'
            f'<td class="gpu">{_e(", ".join(i["gpus"]))}</td><td class="xid">{_e(", ".join(i["xids"]))}</td>'
            f'<td class="desc">{"<br>".join(_e(d) for d in i["descriptions"][:3])}'
            f'{" (+%d more)" % (len(i["descriptions"]) - 3) if len(i["descriptions"]) > 3 else ""}</td>'
            f'<td>{utc(i["opened_at"])}</td><td>{_runbook(i, safe_url)}</td><td>{_ack_button(i)}</td></tr>')
    head = ("<tr><th>id</th><th>state</th><th>severity</th><th>alert</th><th>node</th><th>GPU</th><th>Xid</th>"
            "<th>description</th><th>opened (UTC)</th><th>runbook</th><th></th></tr>")
    return f"<table>{head}{''.join(rows)}</table>" if rows else "<p>None.</p>"


def _remediation(rem: dict | None) -> str:
    """The remediation controller's state (:func:`gpuobs.pager.remediation.status`): breaker, nodes out of
    service, holds; empty without a controller."""
    if rem is None:
        return ""
    if "error" in rem:
        return f'<section id="remediation"><h2>Remediation</h2><p>{_e(rem["error"])}</p></section>'
    b = rem["breaker"]
    breaker = (f'<p class="breaker open"><strong>Breaker OPEN</strong> since {utc(b.get("opened_at"))}: '
               f'{_e(b.get("reason", ""))}</p>' if b.get("open") else '<p class="breaker">Breaker closed.</p>')
    out = "".join(f'<tr><td class="node">{_e(e["node"])}</td><td>{_e(e["pool"])}</td><td class="state">'
                  f'{_e(e["state"])}</td><td>{_e(e["alertname"])} -&gt; {_e(e["action"])}</td><td>{_e(e["reason"])}</td></tr>'
                  for e in rem.get("out_of_service", []))
    holds = "".join(f'<tr><td class="node">{_e(n)}</td><td>{_e(h.get("by", ""))}</td><td>{_e(h.get("reason", ""))}</td>'
                    f'<td>{utc(h.get("ts"))}</td></tr>' for n, h in sorted((rem.get("holds") or {}).items()))
    return (f'<section id="remediation"><h2>Remediation ({_e(rem.get("mode", ""))})</h2>{breaker}'
            f'<h3>Out of service</h3>' + (f"<table><tr><th>node</th><th>pool</th><th>state</th><th>fault -&gt; action"
                                         f"</th><th>why</th></tr>{out}</table>" if out else "<p>None.</p>")
            + "<h3>Held by a person</h3>" + (f"<table><tr><th>node</th><th>by</th><th>reason</th><th>since (UTC)</th>"
                                             f"</tr>{holds}</table>" if holds else "<p>None.</p>") + "</section>")


def index(incs: list[dict], counts: dict[str, dict[str, int]], safe_url: Callable[[str], str | None],
          remediation: dict | None = None) -> str:
    """The console's front page (``remediation``: the controller's status, shown when given)."""
    open_pages = counts["page"]["open"]
    body = [f"<h1>gpuobs incidents</h1><p class=\"count\"><span id=\"open-pages\">{open_pages}</span> open "
            f"page{'s' if open_pages != 1 else ''}, {counts['page']['acknowledged']} acknowledged; "
            f"<span id=\"open-tickets\">{counts['ticket']['open']}</span> open ticket"
            f"{'s' if counts['ticket']['open'] != 1 else ''}, {counts['ticket']['acknowledged']} acknowledged</p>"
            "<p><a href=\"/notifications\">notification log</a> | <a href=\"/runbooks/\">runbooks</a> | "
            "<a href=\"/api/incidents\">JSON</a></p>"]
    for channel, title in (("page", "Pages"), ("ticket", "Tickets")):
        mine = [i for i in incs if i["channel"] == channel]
        live = [i for i in mine if i["state"] != "resolved"]
        done = [i for i in mine if i["state"] == "resolved"][:50]
        body.append(f'<section id="{channel}s"><h2>{title}</h2><h3>Open and acknowledged</h3>{_rows(live, safe_url)}'
                    f"<h3>Recently resolved</h3>{_rows(done, safe_url)}</section>")
    body.append(_remediation(remediation))
    total_open = open_pages + counts["ticket"]["open"]
    return _doc(f"({total_open} open) gpuobs incidents", "".join(body))


def _detail(ev: dict) -> str:
    skip = {"at", "kind"}
    return ", ".join(f"{k}={v if not isinstance(v, list) else ' '.join(map(str, v))}"
                     for k, v in sorted(ev.items()) if k not in skip)


def incident(inc: dict, safe_url: Callable[[str], str | None], silences_enabled: bool,
             live_silences: dict[str, str] | None = None, message: str = "") -> str:
    """One incident's page (``live_silences``: silence id -> state read from Alertmanager now)."""
    iid = inc["id"]
    facts = [("state", f'<span class="{_e(inc["state"])} state">{_e(inc["state"])}</span>'),
             ("channel", _e(inc["channel"])), ("severity", _e(inc["severity"])),
             ("alert", _e(", ".join(inc["alertnames"]))), ("node", _e(", ".join(inc["nodes"]))),
             ("GPU", _e(", ".join(inc["gpus"]))), ("Xid", _e(", ".join(inc["xids"]))),
             ("firing alerts", _e(inc["firing"])), ("opened", utc(inc["opened_at"])),
             ("acknowledged", f'{utc(inc["acknowledged_at"])} {_e(inc["acknowledged_by"] or "")}'),
             ("escalated", utc(inc.get("escalated_at"))),
             ("resolved", utc(inc["resolved_at"])), ("runbook", _runbook(inc, safe_url))]
    body = [f'<p><a href="/">&larr; incidents</a></p><h1>Incident #{iid}: {_e(", ".join(inc["alertnames"]))}</h1>']
    if message:
        body.append(f'<p class="message"><strong>{_e(message)}</strong></p>')
    body.append("<ul class=\"descriptions\">" + "".join(f"<li>{_e(d)}</li>" for d in inc["descriptions"]) + "</ul>")
    body.append("<table class=\"facts\">" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
                + "</table>" + _ack_button(inc))
    extra = {k: v for a in inc["alerts"] for k, v in a["annotations"].items()
             if k not in ("summary", "description", "runbook_url")}
    if extra:  # e.g. a rollout notice's "report" (the commands that write its report)
        body.append("<h2>Annotations</h2><table class=\"annotations\">" + "".join(
            f"<tr><th>{_e(k)}</th><td><code>{_e(v)}</code></td></tr>" for k, v in sorted(extra.items())) + "</table>")
    alerts = "".join(
        f'<tr><td class="{_e(a["status"])}">{_e(a["status"])}</td><td>{_e(a["labels"].get("alertname", ""))}</td>'
        f'<td>{_e(a["startsAt"])}</td><td><code>{_e(", ".join(f"{k}={v}" for k, v in sorted(a["labels"].items())))}'
        f"</code></td></tr>" for a in inc["alerts"])
    body.append(f"<h2>Alerts</h2><table><tr><th>status</th><th>alert</th><th>since</th><th>labels</th></tr>{alerts}"
                "</table>")
    live_silences = live_silences or {}
    sil = []
    for s in inc["silences"]:
        state = live_silences.get(s["id"], "expired" if s["expired_at"] else "unknown")
        expire = ""
        if silences_enabled and state in ("active", "pending"):
            expire = (f'<form class="inline" method="post" action="/incidents/{iid}/silences/{_e(s["id"])}/expire">'
                      '<button type="submit">Expire</button></form>')
        sil.append(f'<tr class="silence"><td><code>{_e(s["id"])}</code></td><td>{_e(state)}</td><td>{_e(s["endsAt"])}'
                   f'</td><td>{_e(s["createdBy"])}</td><td>{_e(s["comment"])}</td><td>{expire}</td></tr>')
    body.append("<h2>Silences</h2>" + (
        "<table><tr><th>id</th><th>state</th><th>ends</th><th>by</th><th>comment</th><th></th></tr>"
        + "".join(sil) + "</table>" if sil else "<p>None.</p>"))
    if silences_enabled:
        body.append(
            f'<form method="post" action="/incidents/{iid}/silence"><label>Duration <input name="duration" '
            'value="2h" size="6"></label> <label>Author <input name="author" value="console" size="12"></label> '
            '<label>Comment <input name="comment" size="40" required></label> '
            '<button type="submit">Silence</button></form>')
    else:
        body.append("<p>Silences need the pager started with --alertmanager-url.</p>")
    rel = inc.get("related") or []
    if rel:  # drills and rollouts overlapping the incident (gpuobs.core.activity)
        body.append("<h2>Related drills and rollouts</h2><table class=\"related\"><tr><th>what</th><th>on</th>"
                    "<th>started (UTC)</th><th>ended (UTC)</th><th>matched by</th><th>report</th></tr>" + "".join(
                        f'<tr class="{_e(r["kind"])}"><td>{_e(r["title"] or r["kind"] + " " + r["id"])}</td>'
                        f'<td>{_e(", ".join(r["nodes"]) or "the whole fleet")}</td><td>{utc(r["started_at"])}</td>'
                        f'<td>{utc(r["ended_at"]) if r["ended_at"] else "running"}</td><td>{_e(r["match"])}</td>'
                        f'<td><code>{_e(r["detail"].get("report", ""))}</code></td></tr>' for r in rel) + "</table>")
    tl = "".join(f'<tr><td>{utc(ev["at"])}</td><td class="kind">{_e(ev["kind"])}</td><td>{_e(_detail(ev))}</td></tr>'
                 for ev in inc["timeline"])
    body.append(f'<h2>Timeline</h2><table class="timeline"><tr><th>at (UTC)</th><th>event</th><th>detail</th></tr>{tl}'
                "</table>")
    return _doc(f"#{iid} {inc['state']} - gpuobs incidents", "".join(body))
