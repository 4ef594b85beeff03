"""HTML views of the incident console (server-rendered, every value escaped; one small script,
:data:`SCRIPT`, served as ``/console.js``, only remembers the acknowledger's name and refreshes the list).

* :func:`index`: open counts, filters (state, severity, channel, node: plain GET parameters, so they
  work without JavaScript), the open and acknowledged incidents grouped by node (worst first), each
  with severity by colour and word, state, alert, GPU and Xid, the templated ``description``, the
  impact line (:mod:`gpuobs.pager.impact`), age, runbook link and Acknowledge (name and note; a plain
  form POST); the recently resolved below. Fits 1280 px without horizontal scroll (fixed table layout,
  long values wrap).
* :func:`incident`: one incident: identity, descriptions, runbook link, alerts, silences (with a
  form to create one and buttons to expire), timeline.
"""

from __future__ import annotations

import datetime as dt
import html
from typing import Any, Callable

_CSS = ("body{font-family:sans-serif;margin:1rem auto;max-width:1240px;padding:0 .5rem;color:#111}"
        "table{border-collapse:collapse;width:100%;table-layout:fixed}"
        "td,th{padding:4px 6px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top;"
        "overflow-wrap:anywhere}code{overflow-wrap:anywhere}"
        ".open{color:#b00;font-weight:bold}.acknowledged{color:#a50}.resolved{color:#070}"
        ".sev{display:inline-block;padding:1px 6px;border-radius:3px;font-weight:bold;font-size:.85rem}"
        ".sev-critical .sev,.sev.sev-critical{background:#c00;color:#fff}.sev-warning .sev,.sev.sev-warning"
        "{background:#f2c200;color:#000}.sev-info .sev,.sev.sev-info{background:#69c;color:#fff}"
        "tr.sev-critical td:first-child{border-left:4px solid #c00}tr.sev-warning td:first-child"
        "{border-left:4px solid #f2c200}tr.sev-info td:first-child{border-left:4px solid #69c}"
        ".impact{color:#333;font-size:.9rem;margin-top:2px}.impact b{color:#000}.desc{color:#222}"
        ".node-group h2{font-size:1.1rem;margin:1.2rem 0 .3rem}.age{white-space:nowrap}"
        "form.inline{display:inline}form.ack input{width:7rem;margin:1px 0}.count{font-size:1.3rem}"
        "#filters{margin:.5rem 0;padding:.4rem;background:#f4f4f4}#filters label{margin-right:.8rem}"
        ".muted{color:#666;font-size:.85rem}td.state{overflow-wrap:normal}td.alert b{font-size:.92rem}"
        "tr.state-resolved td:first-child{border-left-color:#9c9}tr.state-resolved .sev{opacity:.55}")
#: Column widths of the incident tables (sum 100%: fits 1280 px with no horizontal scroll).
_COLS = '<colgroup><col style="width:5%"><col style="width:9%"><col style="width:11%"><col style="width:17%">' \
        '<col style="width:36%"><col style="width:7%"><col style="width:15%"></colgroup>'
#: The console's script (served as /console.js; the pages allow scripts from the pager only): the
#: acknowledger's name remembered per browser, and the list refreshed in place every 15 s.
SCRIPT = """(function () {
  var KEY = "gpuobs.ack.name";
  function fill(root) {
    var name = localStorage.getItem(KEY) || "";
    root.querySelectorAll('input[name="by"], input[name="author"]').forEach(function (i) { if (!i.value) i.value = name; });
  }
  document.addEventListener("submit", function (e) {
    var by = e.target.querySelector && e.target.querySelector('input[name="by"], input[name="author"]');
    if (by && by.value) localStorage.setItem(KEY, by.value);
  });
  fill(document);
  var live = document.getElementById("live");
  if (!live) return;
  function refresh() {
    var a = document.activeElement;
    if (a && (a.tagName === "INPUT" || a.tagName === "SELECT")) return;  // never under a person's typing
    fetch(location.href, {cache: "no-store"}).then(function (r) { return r.text(); }).then(function (t) {
      var doc = new DOMParser().parseFromString(t, "text/html");
      var fresh = doc.getElementById("live");
      if (!fresh) return;
      live.innerHTML = fresh.innerHTML;
      fill(live);
      document.title = doc.title;
      var st = document.getElementById("refreshed");
      if (st) st.textContent = "refreshed " + new Date().toISOString().slice(11, 19) + "Z";
    }).catch(function () {
      var st = document.getElementById("refreshed");
      if (st) st.textContent = "refresh failed (pager unreachable?)";
    });
  }
  setInterval(refresh, 15000);
})();
"""
#: Filters the console accepts (``GET /?state=&severity=&node=&channel=``) and their allowed values.
FILTERS = {"state": ("open", "acknowledged", "resolved"), "severity": ("critical", "warning", "info"),
           "channel": ("page", "ticket")}


def utc(ts: float | None) -> str:
    """Epoch seconds -> ``2026-12-01 17:00:00Z`` (empty for None)."""
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _e(v: Any) -> str:
    return html.escape(str(v))


def _doc(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><meta name=\"viewport\" "
            f"content=\"width=device-width\"><title>{_e(title)}</title><style>{_CSS}</style>"
            f"<script src=\"/console.js\" defer></script></head><body>{body}</body></html>")


def age(seconds: float) -> str:
    """``42s``, ``12m``, ``3h05m``, ``2d04h``: how long ago, at a glance."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def impact_html(inc: dict) -> str:
    """The incident's impact line (:mod:`gpuobs.pager.impact`) for the console, or '' before any."""
    imp = inc.get("impact") or {}
    if "line" in imp:
        err = f' <span class="muted">(last measurement failed: {_e(imp["error"])})</span>' if imp.get("error") else ""
        return f'<div class="impact"><b>Impact</b> {_e(imp["line"])}{err}</div>'
    if imp.get("error"):
        return f'<div class="impact muted">Impact not measured: {_e(imp["error"])}</div>'
    return ""


def _runbook(inc: dict, safe_url: Callable[[str], str | None]) -> str:
    raw = inc.get("runbook_url", "")
    url = safe_url(raw) if raw else None
    if url:
        return f'<a href="{_e(url)}">runbook</a>'
    return f"<code>{_e(raw[:200])}</code> (not under the runbook base)" if raw else ""


def _ack_button(inc: dict) -> str:
    if inc["state"] != "open":
        return ""
    # who acknowledges: the name typed here (remembered per browser by /console.js; the silence form's
    # Author, the CLI's --author); empty: "console". The note goes on the timeline.
    return (f'<form class="inline ack" method="post" action="/incidents/{inc["id"]}/ack">'
            '<input name="by" maxlength="100" placeholder="your name" aria-label="acknowledged by"> '
            '<input name="note" maxlength="500" placeholder="note (optional)" aria-label="note"> '
            f'<button type="submit" name="ack" value="{inc["id"]}">Acknowledge</button></form>')


def _row(i: dict, safe_url: Callable[[str], str | None], now: float) -> str:
    what = [f'<b>{_e(", ".join(i["alertnames"]))}</b>']
    if i["gpus"]:
        what.append(f'GPU <span class="gpu">{_e(", ".join(i["gpus"]))}</span>')
    if i["xids"]:
        what.append(f'Xid <span class="xid">{_e(", ".join(i["xids"]))}</span>')
    descs = "<br>".join(_e(d) for d in i["descriptions"][:2])
    more = f' <span class="muted">(+{len(i["descriptions"]) - 2} more)</span>' if len(i["descriptions"]) > 2 else ""
    since = i["resolved_at"] if i["state"] == "resolved" and i["resolved_at"] else i["opened_at"]
    ack = (f'<div class="muted">by {_e(i["acknowledged_by"])}</div>'
           if i["state"] == "acknowledged" and i.get("acknowledged_by") else "")
    return (f'<tr class="sev-{_e(i["severity"])} state-{_e(i["state"])}" id="incident-{i["id"]}" '
            f'data-node="{_e(",".join(i["nodes"] or affected(i)))}">'
            f'<td><a href="/incidents/{i["id"]}">#{i["id"]}</a></td>'
            f'<td><span class="sev sev-{_e(i["severity"])}">{_e(i["severity"] or "none")}</span>'
            f'<div class="muted">{_e(i["channel"])}</div></td>'
            f'<td class="{_e(i["state"])} state">{_e(i["state"])}</td>'
            f'<td class="alert">{"<br>".join(what)}{ack}</td>'
            f'<td><div class="desc">{descs}{more}</div>{impact_html(i)}</td>'
            f'<td class="age" title="{"resolved" if i["state"] == "resolved" else "opened"} {utc(since)}">'
            f'{"resolved " if i["state"] == "resolved" else ""}{age(now - since)}</td>'
            f'<td>{_runbook(i, safe_url)} {_ack_button(i)}</td></tr>')


def _table(incs: list[dict], safe_url: Callable[[str], str | None], now: float) -> str:
    head = ("<tr><th>id</th><th>severity</th><th>state</th><th>alert</th><th>what and impact</th>"
            "<th>age</th><th>actions</th></tr>")
    return f"<table>{_COLS}{head}{''.join(_row(i, safe_url, now) for i in incs)}</table>"


def _groups(incs: list[dict], safe_url: Callable[[str], str | None], now: float) -> str:
    """Incidents grouped by node (the node with the worst open incident first; fleet-wide ones, with no
    node, under "fleet-wide")."""
    from gpuobs.pager.incidents import SEVERITY_ORDER, STATES

    by: dict[str, list[dict]] = {}
    for i in incs:
        by.setdefault(", ".join(i["nodes"]) or "fleet-wide", []).append(i)

    def rank(item):
        name, mine = item
        return (min(STATES.index(i["state"]) for i in mine), min(SEVERITY_ORDER.get(i["severity"], 9) for i in mine),
                -max(i["updated_at"] for i in mine), name)
    out = []
    for name, mine in sorted(by.items(), key=rank):
        worst = min(mine, key=lambda i: (SEVERITY_ORDER.get(i["severity"], 9)))["severity"]
        n_open = sum(i["state"] == "open" for i in mine)
        out.append(f'<section class="node-group" data-node="{_e(name)}"><h2>{_e(name)} '
                   f'<span class="sev sev-{_e(worst)}">{_e(worst or "none")}</span> '
                   f'<span class="muted">{len(mine)} incident{"s" if len(mine) != 1 else ""}, {n_open} open</span>'
                   f'</h2>{_table(mine, safe_url, now)}</section>')
    return "".join(out)


def _filters(incs: list[dict], chosen: dict[str, str]) -> str:
    nodes = sorted({n for i in incs for n in (*i["nodes"], *affected(i))})

    def select(name: str, values) -> str:
        opts = "".join(f'<option value="{_e(v)}"{" selected" if chosen.get(name) == v else ""}>{_e(v)}</option>'
                       for v in values)
        return f'<label>{name} <select name="{name}"><option value="">all</option>{opts}</select></label>'
    return ('<form id="filters" method="get" action="/">' + select("state", FILTERS["state"])
            + select("severity", FILTERS["severity"]) + select("channel", FILTERS["channel"]) + select("node", nodes)
            + '<button type="submit">Filter</button> <a href="/">clear</a> '
            '<span id="refreshed" class="muted">refreshes every 15 s</span></form>')


def affected(inc: dict) -> list[str]:
    """Nodes an incident without a node of its own names in its alerts' ``affected_nodes`` annotation
    (a rollout notice's stage)."""
    return [n.strip() for a in inc.get("alerts", []) for n in (a.get("annotations") or {}).get("affected_nodes", "").split(",")
            if n.strip()]


def select(incs: list[dict], chosen: dict[str, str]) -> list[dict]:
    """The incidents matching the console's filters (``chosen``: name -> value, :data:`FILTERS` plus
    ``node``; empty values match everything)."""
    def keep(i: dict) -> bool:
        return ((not chosen.get("state") or i["state"] == chosen["state"])
                and (not chosen.get("severity") or i["severity"] == chosen["severity"])
                and (not chosen.get("channel") or i["channel"] == chosen["channel"])
                and (not chosen.get("node") or chosen["node"] in i["nodes"] or chosen["node"] in affected(i)))
    return [i for i in incs if keep(i)]


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
          remediation: dict | None = None, chosen: dict[str, str] | None = None, now: float | None = None) -> str:
    """The console's front page: counts, filters (``chosen``, see :func:`select`), the open and
    acknowledged incidents grouped by node with severity (colour and word), state, impact line, age and
    Acknowledge (name and note); the recently resolved below; ``remediation``: the controller's status,
    shown when given. Everything inside ``#live`` is what /console.js refreshes in place."""
    import time as _time

    now = _time.time() if now is None else now
    chosen = chosen or {}
    open_pages = counts["page"]["open"]
    shown = select(incs, chosen)
    live = [i for i in shown if i["state"] != "resolved"]
    done = [i for i in shown if i["state"] == "resolved"][:50]
    body = [f"<h1>gpuobs incidents</h1><p class=\"count\"><span id=\"open-pages\">{open_pages}</span> open "
            f"page{'s' if open_pages != 1 else ''}, {counts['page']['acknowledged']} acknowledged; "
            f"<span id=\"open-tickets\">{counts['ticket']['open']}</span> open ticket"
            f"{'s' if counts['ticket']['open'] != 1 else ''}, {counts['ticket']['acknowledged']} acknowledged</p>"
            "<p><a href=\"/notifications\">notification log</a> | <a href=\"/runbooks/\">runbooks</a> | "
            "<a href=\"/api/incidents\">JSON</a></p>", _filters(incs, chosen), '<div id="live">']
    body.append('<section id="active"><h2 class="sr">Open and acknowledged</h2>'
                + (_groups(live, safe_url, now) if live else "<p>Nothing open.</p>") + "</section>")
    body.append(f'<details id="resolved"{" open" if chosen.get("state") == "resolved" else ""}><summary>'
                f"Recently resolved ({len(done)})</summary>"
                + (_table(done, safe_url, now) if done else "<p>None.</p>") + "</details>")
    body.append(_remediation(remediation))
    body.append("</div>")
    total_open = open_pages + counts["ticket"]["open"]
    return _doc(f"({total_open} open) gpuobs incidents", "".join(body))


def _detail(ev: dict) -> str:
    skip = {"at", "kind"}
    return ", ".join(f"{k}={v if not isinstance(v, list) else ' '.join(map(str, v))}"
                     for k, v in sorted(ev.items()) if k not in skip)


def _impact_section(inc: dict) -> str:
    """The incident page's Impact: the line, per-workload numbers and the PromQL behind them."""
    imp = inc.get("impact") or {}
    if "line" not in imp:
        return ("<h2>Impact</h2>" + (impact_html(inc) or '<p class="muted">Not measured yet (the pager measures '
                                     "with --prometheus-url).</p>"))
    rows = []
    for e in imp.get("serving", []):
        rows.append(f"<tr><td>serving {_e(e.get('model_name', ''))} ({_e(e.get('instance', ''))})</td>"
                    f"<td>{e['requests']}</td><td>{e['failed']} ({e['failed_excess']} above baseline)</td>"
                    f"<td>{e['over_ttft_slo']} ({e['over_ttft_slo_excess']} above baseline)</td>"
                    f"<td>{_e(e['goodput_lost'])} ({_e(e['goodput_lost_per_s'])} req/s)</td></tr>")
    serving = ("<table class=\"impact-serving\"><tr><th>engine</th><th>requests</th><th>failed</th>"
               "<th>over TTFT SLO</th><th>goodput lost</th></tr>" + "".join(rows) + "</table>") if rows else ""
    trows = "".join(f"<tr><td>{_e(t['training_job'])}</td><td>{t['gpus']}</td><td>{t['ranks_stalled']}</td>"
                    f"<td>{_e(t['stalled_s'])}</td><td>{_e(t['gpu_hours_lost'])}</td></tr>" for t in imp.get("training", []))
    training = ("<table class=\"impact-training\"><tr><th>training job</th><th>GPUs</th><th>ranks stalled</th>"
                "<th>stalled (s)</th><th>GPU-hours lost</th></tr>" + trows + "</table>") if trows else ""
    w = imp["window"]
    queries = "".join(f"<tr><th>{_e(k)}</th><td><code>{_e(v)}</code></td></tr>" for k, v in sorted(imp["queries"].items()))
    return (f"<h2>Impact</h2>{impact_html(inc)}<p class=\"muted\">Window {utc(w['start'])} to {utc(w['end'])} "
            f"({w['seconds']:.0f} s), baseline: the node's own {imp['baseline_s']:.0f} s before; join by "
            f"{_e(imp['join'])}; measured {utc(imp['measured_at'])}.</p>{serving}{training}"
            f"<details><summary>PromQL (evaluate at {_e(imp.get('evaluated_at', ''))})</summary>"
            f"<table class=\"impact-queries\">{queries}</table></details>")


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
    body.append(_impact_section(inc))
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
            'value="2h" size="6"></label> <label>Author <input name="author" size="12" placeholder="your name"></label> '
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
