"""The local pager: an Alertmanager webhook receiver that records every notification.

Routes:

* ``POST /hook/page`` and ``POST /hook/ticket``: Alertmanager webhook v4 payloads. With a token
  (``--token-file``) they need ``Authorization: Bearer <token>`` (401 otherwise, nothing read or
  stored); Alertmanager sends it from its webhook ``http_config.authorization.credentials_file``.
  Validated, stored in SQLite (committed) and only then answered 200 ``{"stored": id,
  "duplicate": false}``. A repeat of a notification already stored (same
  :func:`~gpuobs.pager.store.delivery_key` within the dedupe window: a webhook retry, a re-send after
  an Alertmanager restart) is answered 200 ``{"stored": id, "duplicate": true}`` and not stored, so
  Alertmanager stops retrying and the on-call sees one page. Malformed -> 400 naming the field,
  nothing stored. Over 4 MiB -> 413.
* ``GET /api/pages[?limit=N&alertname=X&status=firing|resolved]``: JSON, newest first.
* ``GET /``: the incident console (:mod:`gpuobs.pager.console`, incidents from
  :mod:`gpuobs.pager.incidents`): open count, pages and tickets in separate sections, Acknowledge
  buttons. ``GET /incidents/<id>``: one incident (alerts, silences, timeline).
* ``GET /api/incidents[?state=open|acknowledged|resolved&channel=page|ticket&limit=N]``:
  ``{"incidents": [...], "counts": {channel: {state: n}}, "open": n}``; ``GET /api/incidents/<id>``:
  one incident with ``timeline`` and ``silences`` (404 when unknown), and ``related``: the drills and
  rollouts recorded in the activity file (``--activity-file``, :mod:`gpuobs.core.activity`) that
  overlap it by node and time, each also on the timeline (``drill started`` / ``drill ended`` /
  ``rollout started`` / ``rollout ended``).
* ``POST /api/incidents/<id>/impact``: measure the incident's impact now (:mod:`gpuobs.pager.impact`,
  needs ``--prometheus-url``; 503 without it) and store it -> ``{"id", "impact"}`` (502 with the
  error, and the last numbers kept, when Prometheus failed). Every incident also carries ``impact``: the last measurement (the
  pager measures open incidents every 30 s and each resolved one once after it resolves), or null.
* ``POST /api/incidents/<id>/ack`` (optional JSON ``{"by": name, "note": text}``) -> ``{"id", "state", "changed"}``;
  ``POST /incidents/<id>/ack`` is the console's form (303 back to the incident).
* ``POST /api/incidents/<id>/silence`` JSON ``{"duration": "2h", "comment": str, "author": str}`` ->
  201 ``{"silence": id, ...}``: a silence created in Alertmanager (API v2, ``--alertmanager-url``)
  matching the incident's common labels, recorded on the incident; ``POST
  /api/incidents/<id>/silences/<silence id>/expire`` expires it. 503 when no Alertmanager is
  configured, 502 when it cannot be reached. Form twins under ``/incidents/<id>/...``.
  Console actions need no token (the pager binds loopback); a request whose ``Origin`` is not this
  pager is refused 403, so another site cannot make a browser press the buttons.
* ``GET /notifications``: the notification log (every delivery, newest first), the pager's old front
  page: channel, status, labels, summary and runbook link (linked only when the ``runbook_url``
  annotation lies under the configured runbook base; any other URL is shown as text, never as a link).
* ``GET /runbooks/<name>.md``: the runbook rendered to HTML with heading anchors matching every
  ``runbook_url`` (:mod:`gpuobs.pager.runbooks`); ``?format=markdown`` gives the source;
  ``GET /runbooks/`` lists them. Served from the runbooks directory, so links work air-gapped.
* ``GET /health``: ``{"status": "ok", "notifications": N, "duplicates": D}`` (D: re-deliveries answered
  without storing, among the keys still in the dedupe window).
"""

from __future__ import annotations

import datetime as dt
import html
import re
import signal
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from gpuobs.core import activity, httpd, log
from gpuobs.core.durations import DurationError, parse_duration
from gpuobs.pager import console, incidents, remediation, webhook
from gpuobs.pager import runbooks as rb_render
from gpuobs.pager.store import CHANNELS, STATUSES, PageStore
from gpuobs.promapi.silences import AlertmanagerClient, SilenceApiError, SilenceInputError

MAX_BODY_BYTES = 4 * 1024 * 1024
_log = log.get("pager")


class PagerServer(httpd.Server):
    """HTTP server owning a :class:`PageStore`."""

    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], store: PageStore, runbooks_dir: Path | None = None,
                 token: str | None = None, runbook_base: str | None = None, alertmanager_url: str | None = None,
                 activity_file: Path | None = None, remediate_url: str | None = None, impact=None):
        super().__init__(addr, PagerHandler)
        self.store = store
        #: The :class:`gpuobs.pager.impact.ImpactWatcher` measuring incidents (None: no Prometheus given).
        self.impact = impact
        #: The remediation controller whose steps join the incidents' timelines (None: none).
        self.remediate_url = remediate_url
        #: Drills and rollouts recorded by their runners (None: incidents are not linked to them).
        self.activity_file = activity_file
        #: Alertmanager API v2 for silences (None: silences disabled, 503).
        self.alertmanager = AlertmanagerClient(alertmanager_url, timeout_s=5.0) if alertmanager_url else None
        self.runbooks_dir = runbooks_dir
        self.token = token
        host, port = self.server_address[:2]
        #: Where runbook links may point: ``<runbook base>/runbooks/``, the layout the rules use
        #: (:func:`gpuobs.mixin.runbooks.runbook_url`); the base defaults to this pager.
        self.runbook_prefix = (runbook_base or f"http://{host}:{port}").rstrip("/") + "/runbooks/"


def with_related(inc: dict, activity_file: Path | None, now: float | None = None) -> dict:
    """``inc`` with ``related`` (drills and rollouts overlapping it by node and time, from
    ``activity_file``; each ``{kind, id, title, nodes, started_at, ended_at, detail, match}``) and
    their start and end added to its ``timeline`` (kept in time order). An unreadable file links
    nothing (the incident is still shown)."""
    try:
        acts = activity.load(activity_file) if activity_file is not None else []
    except OSError as exc:
        _log.warning("activity file unreadable", extra={"fields": {"path": str(activity_file), "error": str(exc)}})
        acts = []
    rel = activity.related(acts, inc.get("nodes") or [], inc["opened_at"], inc.get("resolved_at"),
                           inc.get("commonLabels") or {}, now=time.time() if now is None else now)
    inc["related"] = [{**a.to_dict(), "match": how} for a, how in rel]
    rows = []
    for a, how in rel:
        where = ", ".join(a.nodes) or "the whole fleet"
        for verb, at in (("started", a.started_at), ("ended", a.ended_at)):
            if at is not None:
                row = {"at": at, "kind": f"{a.kind} {verb}", a.kind: a.id, "title": a.title, "on": where,
                       "match": how}
                if verb == "ended" and a.detail.get("outcome"):
                    row["outcome"] = a.detail["outcome"]
                rows.append(row)
    if rows:
        inc["timeline"] = sorted([*inc["timeline"], *rows], key=lambda e: e["at"])
    return inc


def _safe_url(url: str, base: str) -> str | None:
    """``url`` if it is an http(s) URL under ``base`` (the configured runbook base), else None.

    "Under" is a prefix match on a base that ends in ``/`` (one is added), so
    ``http://127.0.0.1:9097/runbooks/`` admits ``.../runbooks/xid.md#gpuxid`` but neither
    ``http://127.0.0.1:9097/runbooksX`` nor ``http://127.0.0.1:90970/...``; ``..`` segments are refused.
    """
    if not base.endswith("/"):
        base += "/"
    if not url.startswith(("http://", "https://")) or not url.startswith(base):
        return None
    rest = url[len(base):].split("#", 1)[0].split("?", 1)[0]
    if ".." in rest.split("/") or "%2e" in rest.lower():
        return None
    return url


def render_html(pages: list[dict], runbook_prefix: str = "http://127.0.0.1:9097/runbooks/") -> str:
    """HTML page listing notifications (all values escaped; runbook links only under ``runbook_prefix``)."""
    rows = []
    for p in pages:
        when = dt.datetime.fromtimestamp(p["received_at"], dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        for a in p["alerts"]:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(a["labels"].items()))
            ann = a["annotations"]
            raw_rb = ann.get("runbook_url", "")
            rb = _safe_url(raw_rb, runbook_prefix)
            link = (f'<a href="{html.escape(rb)}">runbook</a>' if rb
                    else (f"<code>{html.escape(raw_rb[:200])}</code> (not under the runbook base)" if raw_rb else ""))
            rows.append(
                f"<tr class=\"{html.escape(a['status'])}\"><td>{when}</td><td>{html.escape(p['channel'])}</td>"
                f"<td>{html.escape(a['status'])}</td><td>{html.escape(a['labels'].get('alertname', ''))}</td>"
                f"<td>{html.escape(ann.get('summary', ''))}</td><td><code>{html.escape(labels)}</code></td>"
                f"<td>{link}</td></tr>")
    body = "\n".join(rows) or '<tr><td colspan="7">No notifications yet.</td></tr>'
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>gpuobs pager</title>"
        "<style>body{font-family:sans-serif}"
        "td,th{padding:4px 8px;border-bottom:1px solid #ddd;text-align:left}"
        "tr.firing td:nth-child(3){color:#b00;font-weight:bold}tr.resolved td:nth-child(3){color:#070}"
        "</style></head><body><p><a href=\"/\">&larr; incidents</a></p><h1>gpuobs notification log</h1><table><tr><th>received (UTC)</th><th>channel</th>"
        "<th>status</th><th>alert</th><th>summary</th><th>labels</th><th>runbook</th></tr>"
        f"{body}</table></body></html>")


class PagerHandler(httpd.Handler):
    """Request handler; see the module docstring (HTTP plumbing: :mod:`gpuobs.core.httpd`)."""

    server: PagerServer
    server_version = "gpuobs-pager"
    max_body_bytes = MAX_BODY_BYTES
    methods = {"GET": "_get", "POST": "_post"}
    logger = _log

    def _get(self) -> None:
        url = urlsplit(self.path)
        qs = parse_qs(url.query)
        store = self.server.store
        if url.path == "/health":
            self.send_json(200, {"status": "ok", "notifications": store.count(), "duplicates": store.duplicates()})
        elif url.path == "/api/pages":
            try:
                limit = int(qs.get("limit", ["100"])[0])
                if not 1 <= limit <= 10000:
                    raise ValueError
            except ValueError:
                self.send_json(400, {"error": "limit must be an integer 1..10000", "field": "limit"})
                return
            status = qs.get("status", [None])[0]
            if status is not None and status not in STATUSES:
                self.send_json(400, {"error": f"status must be one of {', '.join(STATUSES)}", "field": "status"})
                return
            self.send_json(200, {"pages": store.list(limit, qs.get("alertname", [None])[0], status)})
        elif url.path == "/api/incidents":
            self._api_incidents(qs)
        elif m := re.fullmatch(r"/api/incidents/([0-9]{1,12})", url.path):
            inc = self._incident(int(m.group(1)))
            if inc is not None:
                self.send_json(200, inc)
        elif url.path == "/runbooks/" and self.server.runbooks_dir:
            self._html(rb_render.index(self.server.runbooks_dir))
        elif url.path.startswith("/runbooks/"):
            name = url.path.removeprefix("/runbooks/")
            rb = self.server.runbooks_dir
            path = rb / name if rb and len(name) <= 128 and rb_render.NAME.fullmatch(name) else None
            if path is None or not path.is_file():
                self.send_json(404, {"error": f"no runbook {name!r}"})
                return
            if qs.get("format", [""])[0] == "markdown":
                self.send_body(200, path.read_bytes(), "text/markdown; charset=utf-8")
            else:
                self._html(rb_render.page(name, path.read_text("utf-8", "replace")))
        elif url.path == "/notifications":
            self._html(render_html(store.list(200), self.server.runbook_prefix))
        elif url.path == "/":
            chosen = {k: qs.get(k, [""])[0][:200] for k in (*console.FILTERS, "node")}
            bad = next((k for k, allowed in console.FILTERS.items() if chosen[k] and chosen[k] not in allowed), None)
            if bad:
                self._html(f"<!doctype html><p>{bad} must be one of {', '.join(console.FILTERS[bad])}. "
                           "<a href=\"/\">incidents</a></p>", 400)
                return
            self._html(console.index(store.incidents(limit=500), store.incident_counts(), self._safe,
                                     remediation.status(self.server.remediate_url), chosen))
        elif url.path == "/console.js":
            self.send_body(200, console.SCRIPT.encode(), "text/javascript; charset=utf-8",
                           headers={"Cache-Control": "no-cache"})
        elif m := re.fullmatch(r"/incidents/([0-9]{1,12})", url.path):
            self._incident_page(int(m.group(1)), qs.get("msg", [""])[0][:300])
        else:
            self.send_json(404, {"error": f"no route {url.path}"})

    # ---- console --------------------------------------------------------------------------------
    def _html(self, text: str, code: int = 200) -> None:
        # Scripts only from the pager itself (/console.js): an injected inline script never runs.
        self.send_body(code, text.encode("utf-8", "backslashreplace"), "text/html; charset=utf-8",
                       headers={"Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                                           "img-src 'self' data:; script-src 'self'"})

    def _safe(self, url: str) -> str | None:
        return _safe_url(url, self.server.runbook_prefix)

    def _incident(self, iid: int) -> dict | None:
        """The incident, or None after answering 404."""
        try:
            return remediation.with_remediation(with_related(self.server.store.incident(iid), self.server.activity_file),
                                                self.server.remediate_url)
        except incidents.IncidentNotFound:
            self.send_json(404, {"error": f"no incident {iid}", "field": "id"})
            return None

    def _api_incidents(self, qs: dict[str, list[str]]) -> None:
        state = qs.get("state", [None])[0]
        channel = qs.get("channel", [None])[0]
        if state is not None and state not in incidents.STATES:
            self.send_json(400, {"error": f"state must be one of {', '.join(incidents.STATES)}", "field": "state"})
            return
        if channel is not None and channel not in CHANNELS:
            self.send_json(400, {"error": f"channel must be one of {', '.join(CHANNELS)}", "field": "channel"})
            return
        try:
            limit = int(qs.get("limit", ["200"])[0])
            if not 1 <= limit <= 10000:
                raise ValueError
        except ValueError:
            self.send_json(400, {"error": "limit must be an integer 1..10000", "field": "limit"})
            return
        store = self.server.store
        counts = store.incident_counts()
        self.send_json(200, {"incidents": store.incidents(state, channel, limit), "counts": counts,
                             "open": sum(c["open"] for c in counts.values())})

    def _incident_page(self, iid: int, message: str = "") -> None:
        try:
            inc = with_related(self.server.store.incident(iid), self.server.activity_file)
        except incidents.IncidentNotFound:
            self._html(f"<!doctype html><p>No incident {iid}. <a href=\"/\">incidents</a></p>", 404)
            return
        am = self.server.alertmanager
        live: dict[str, str] = {}
        if am is not None and inc["silences"]:
            try:
                ids = {s["id"] for s in inc["silences"]}
                live = {s["id"]: s.get("status", {}).get("state", "unknown") for s in am.list() if s.get("id") in ids}
            except SilenceApiError as exc:
                message = message or f"Alertmanager unreachable, silence states unknown: {exc}"
        self._html(console.incident(inc, self._safe, am is not None, live, message))

    def _same_origin(self) -> bool:
        """False (after answering 403) when the request's Origin is another site."""
        origin = self.headers.get("Origin")
        if origin is None:  # curl, the CLI, and browsers on same-origin GET-less forms may omit it
            return True
        host = self.headers.get("Host", "")
        if urlsplit(origin).netloc == host and host:
            return True
        self.discard_body()
        self.send_json(403, {"error": f"Origin {origin[:100]!r} is not this pager; console actions come from its own pages"})
        return False

    def _form_or_json(self, form: bool) -> dict | None:
        """The request's fields (form-encoded or JSON object), or None after answering 400/411/413."""
        if form:
            raw = self.read_body()
            if raw is None:
                return None
            try:
                return {k: v[0] for k, v in parse_qs(raw.decode("utf-8"), keep_blank_values=True).items()}
            except UnicodeDecodeError:
                self.send_json(400, {"error": "form body is not UTF-8", "field": "body"})
                return None
        if self.headers.get("Content-Length") in (None, "0"):
            self.discard_body()
            return {}
        doc = self.read_json()
        if doc is httpd.INVALID:
            return None
        if not isinstance(doc, dict):
            self.send_json(400, {"error": "body must be a JSON object", "field": "body"})
            return None
        return doc

    def _action(self, path: str) -> bool:
        """Console and API actions on incidents; False when ``path`` is not one of them."""
        m = re.fullmatch(r"/(api/)?incidents/([0-9]{1,12})/(ack|silence|silences/([0-9a-fA-F-]{1,64})/expire)", path)
        if not m:
            return False
        api, iid, action, sid = m.group(1) is not None, int(m.group(2)), m.group(3), m.group(4)
        if not self._same_origin():
            return True
        fields = self._form_or_json(not api)
        if fields is None:
            return True

        def answer(code: int, doc: dict) -> None:
            if api:
                self.send_json(code, doc)
            else:  # the console: back to the incident page, with the outcome shown
                from urllib.parse import quote
                msg = doc.get("error") or doc.get("message", "")
                self.send_body(303, b"", "text/plain", headers={"Location": f"/incidents/{iid}?msg={quote(msg)}"})

        by = str(fields.get("by") or fields.get("author") or ("console" if not api else "api"))[:100]
        store = self.server.store
        try:
            inc = store.incident(iid)
        except incidents.IncidentNotFound:
            self.send_json(404, {"error": f"no incident {iid}", "field": "id"})
            return True
        if action == "ack":
            state, changed = store.acknowledge(iid, by, note=str(fields.get("note") or "")[:500])
            _log.info("incident acknowledged" if changed else "acknowledge: nothing to do",
                      extra={"fields": {"incident": iid, "by": by, "state": state}})
            answer(200, {"id": iid, "state": state, "changed": changed,
                         "message": f"acknowledged by {by}" if changed else f"incident is {state}; nothing to acknowledge"})
            return True
        am = self.server.alertmanager
        if am is None:
            answer(503, {"error": "silences need the pager started with --alertmanager-url"})
            return True
        try:
            if action == "silence":
                try:
                    dur = parse_duration(fields.get("duration", fields.get("duration_s", "")), "duration")
                except DurationError as exc:
                    answer(400, {"error": str(exc), "field": "duration"})
                    return True
                comment = str(fields.get("comment", ""))[:1000]
                sil_id, body = am.create(inc["commonLabels"], dur, by, comment)
                store.record_silence(iid, sil_id, body["endsAt"], body["createdBy"], body["comment"], body["matchers"])
                _log.info("silence created", extra={"fields": {"incident": iid, "silence": sil_id, "by": by}})
                answer(201, {"id": iid, "silence": sil_id, "endsAt": body["endsAt"], "matchers": body["matchers"],
                             "message": f"silence {sil_id} created until {body['endsAt']}"})
            else:
                if sid not in {s["id"] for s in inc["silences"]}:
                    answer(404, {"error": f"silence {sid} is not one of incident {iid}'s", "field": "silence"})
                    return True
                am.expire(sid)
                store.record_silence_expired(iid, sid, by)
                answer(200, {"id": iid, "silence": sid, "expired": True, "message": f"silence {sid} expired"})
        except SilenceInputError as exc:
            answer(400, {"error": str(exc)})
        except SilenceApiError as exc:
            _log.warning("alertmanager silences API failed", extra={"fields": {"error": str(exc)}})
            answer(502, {"error": f"Alertmanager: {exc}"})
        return True

    def _measure(self, iid: int) -> None:
        """``POST /api/incidents/<id>/impact``: measure the incident's impact now and store it."""
        self.discard_body()
        if self.server.impact is None:
            self.send_json(503, {"error": "impact needs the pager started with --prometheus-url"})
            return
        try:
            doc = self.server.impact.measure_one(iid, time.time())
        except incidents.IncidentNotFound:
            self.send_json(404, {"error": f"no incident {iid}", "field": "id"})
            return
        # a failure keeps the last numbers with "error": still a 502, never stale numbers passed off as new
        self.send_json(502 if doc.get("error") else 200, {"id": iid, "impact": doc})

    def _post(self) -> None:
        path = urlsplit(self.path).path
        if m := re.fullmatch(r"/api/incidents/([0-9]{1,12})/impact", path):
            if self._same_origin():  # another site must not make a browser load Prometheus through us
                self._measure(int(m.group(1)))
            return
        if self._action(path):
            return
        channel = path.removeprefix("/hook/")
        if not path.startswith("/hook/") or channel not in CHANNELS:
            self.discard_body()
            self.send_json(404, {"error": f"no route {path}; POST to /hook/page or /hook/ticket"})
            return
        payload = webhook.read_payload(self, self.server.token, "gpuobs-pager", _log)
        if payload is None:
            return
        nid, duplicate = self.server.store.deliver(channel, payload)
        _log.info("duplicate notification not stored" if duplicate else "notification stored", extra={"fields": {
            "id": nid, "channel": channel, "status": payload["status"], "duplicate": duplicate,
            "alerts": [a["labels"]["alertname"] for a in payload["alerts"]]}})
        self.send_json(200, {"stored": nid, "duplicate": duplicate})


def serve(host: str, port: int, db_path: Path, runbooks_dir: Path | None = None, token: str | None = None,
          runbook_base: str | None = None, dedupe_window_s: float | None = None,
          alertmanager_url: str | None = None, escalation=None, activity_file: Path | None = None,
          identity_label: str | None = None, reconcile_after_s: float | None = None,
          remediate_url: str | None = None, prometheus_url: str | None = None, impact_config=None) -> None:
    """Run the pager until SIGTERM/SIGINT (``token``: required bearer token of the webhooks;
    ``alertmanager_url``: Alertmanager for silences, None disables them; ``escalation``: a
    :class:`gpuobs.pager.escalation.Policy` or None; ``activity_file``: drills and rollouts to link
    incidents to, :mod:`gpuobs.core.activity`; ``identity_label``: the fleet config's, which names an
    incident's nodes, default the shipped one's; ``reconcile_after_s``: with ``alertmanager_url``, resolve
    incidents whose alerts Alertmanager no longer holds after that many seconds without a notification,
    :mod:`gpuobs.pager.reconcile`; None or 0: never; ``prometheus_url`` with ``impact_config`` (a
    :class:`gpuobs.pager.impact.ImpactConfig`): measure every incident's impact, :mod:`gpuobs.pager.impact`)."""
    store = PageStore(db_path, identity_label=identity_label) if dedupe_window_s is None \
        else PageStore(db_path, dedupe_window_s, identity_label)
    watcher = None
    if prometheus_url and impact_config is not None:
        from gpuobs.pager.impact import ImpactWatcher, measure
        from gpuobs.promapi.prometheus import PromClient

        prom = PromClient(prometheus_url, timeout=10.0, retries=1)
        watcher = ImpactWatcher(store, lambda inc, now: measure(prom, impact_config, inc, now))
    srv = PagerServer((host, port), store, runbooks_dir, token, runbook_base, alertmanager_url, activity_file,
                      remediate_url, watcher)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    from gpuobs.pager.periodic import HeldReleaser
    am_alerts = None
    if alertmanager_url:
        from gpuobs.promapi.silences import AlertmanagerClient
        am_alerts = AlertmanagerClient(alertmanager_url).fingerprints
    releaser = HeldReleaser(store, am_alerts).start()
    escalator = None
    if escalation is not None:
        from gpuobs.pager.escalation import Escalator
        escalator = Escalator(store, escalation).start()
    reconciler = None
    if alertmanager_url and reconcile_after_s:
        from gpuobs.pager.reconcile import Reconciler
        from gpuobs.promapi.silences import AlertmanagerClient
        reconciler = Reconciler(store, AlertmanagerClient(alertmanager_url).fingerprints, reconcile_after_s).start()
    if watcher is not None:
        watcher.start()
    _log.info("pager listening", extra={"fields": {"addr": f"{host}:{port}", "db": str(db_path)}})
    done.wait()
    releaser.stop()
    if escalator is not None:
        escalator.stop()
    if reconciler is not None:
        reconciler.stop()
    if watcher is not None:
        watcher.stop()
    srv.shutdown()
    srv.server_close()
    store.close()
