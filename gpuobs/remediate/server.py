"""``gpuobs remediate serve``: the controller's webhook receiver, its loop, its API and its metrics.

Routes (127.0.0.1 by default):

* ``POST /hook/remediate``: Alertmanager webhook v4 payloads (validated as the pager validates them,
  :func:`gpuobs.pager.store.validate`); with a token, ``Authorization: Bearer <token>`` is required (401
  otherwise, nothing read). Answers ``{"outcomes": {outcome: n}}``; a re-sent alert is ``duplicate``.
* ``GET /api/status``: :meth:`Controller.status`; ``GET /api/timeline[?node=N]``: the timeline.
* ``GET /metrics``: Prometheus exposition, every figure read from the store at scrape time (so a
  restart loses no count):

  - ``gpuobs_remediation_episodes{state}``: open episodes per state, and escalations not yet released;
  - ``gpuobs_remediation_out_of_service_nodes{pool}``: nodes the controller keeps out, per pool;
  - ``gpuobs_remediation_escalated{node, alertname}``: 1 per escalated node until released (the
    ``RemediationEscalated`` ticket);
  - ``gpuobs_remediation_breaker_open``, ``gpuobs_remediation_breaker_nodes``: the fleet breaker (the
    ``RemediationHalted`` page) and how many nodes tripped it;
  - ``gpuobs_remediation_interlock_holds_total{interlock}``: timeline entries where an interlock held an
    action back; ``gpuobs_remediation_steps_total{step, status}``: node actions by outcome;
    ``gpuobs_remediation_events_total{outcome}``: alerts received by outcome;
  - ``gpuobs_remediation_mode{mode}``: 1 for the running mode; ``gpuobs_remediation_last_tick_timestamp_seconds``.

The loop ticks the controller every ``interval_s`` seconds; webhooks and ticks share one lock, so an
ingest and a tick never interleave. Holds, releases and the breaker's close go through the database
(``gpuobs remediate hold|release|breaker close``), which the loop reads each tick.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpuobs.core import httpd
from gpuobs.pager import webhook
from gpuobs.remediate.controller import Controller
from gpuobs.remediate.store import OPEN_STATES

_log = logging.getLogger("gpuobs.remediate.server")


class StoreCollector:
    """The metrics in the module docstring, computed from the controller's store at each scrape."""

    def __init__(self, controller: Controller, lock: threading.Lock):
        self.c, self.lock = controller, lock
        self.last_tick = 0.0

    def collect(self):
        with self.lock:
            store = self.c.store
            open_eps = store.episodes(OPEN_STATES)
            out = store.out_of_service()
            breaker = store.breaker()
            holds = store.db.execute("SELECT actor, count(*) FROM timeline WHERE actor LIKE 'interlock:%' "
                                     "GROUP BY actor").fetchall()
            steps = store.db.execute("SELECT step, status, count(*) FROM steps GROUP BY step, status").fetchall()
            events = store.db.execute("SELECT outcome, count(*) FROM events GROUP BY outcome").fetchall()
        g = GaugeMetricFamily("gpuobs_remediation_episodes", "Remediation episodes open, by state (escalated: "
                              "not yet released).", labels=["state"])
        counts = {s: 0 for s in (*OPEN_STATES, "escalated")}
        for e in open_eps:
            counts[e.state] += 1
        counts["escalated"] = sum(1 for e in out if e.state == "escalated")
        for s, n in counts.items():
            g.add_metric([s], n)
        yield g
        pools: dict[str, int] = {v.pool: 0 for v in self.c._views.values()}
        for e in out:
            pools[e.pool] = pools.get(e.pool, 0) + 1
        g = GaugeMetricFamily("gpuobs_remediation_out_of_service_nodes",
                              "Nodes the remediation controller keeps out of service, per pool.", labels=["pool"])
        for p, n in sorted(pools.items()):
            g.add_metric([p], n)
        yield g
        g = GaugeMetricFamily("gpuobs_remediation_escalated", "1 per node whose remediation escalated (RMA ticket), "
                              "until a person releases it.", labels=[self.c.identity_label, "alertname"])
        for e in out:
            if e.state == "escalated":
                g.add_metric([e.node, e.alertname], 1)
        yield g
        yield GaugeMetricFamily("gpuobs_remediation_breaker_open", "1 while the fleet circuit breaker is open "
                                "(remediation halted).", value=1 if breaker["open"] else 0)
        yield GaugeMetricFamily("gpuobs_remediation_breaker_nodes", "Nodes whose events tripped the open breaker "
                                "(0 when closed).", value=len(breaker["nodes"]) if breaker["open"] else 0)
        c = CounterMetricFamily("gpuobs_remediation_interlock_holds", "Times an interlock held a remediation "
                                "action back (timeline entries).", labels=["interlock"])
        for actor, n in holds:
            c.add_metric([actor.removeprefix("interlock:")], n)
        yield c
        c = CounterMetricFamily("gpuobs_remediation_steps", "Node actions taken, by step and outcome.",
                                labels=["step", "status"])
        for step, status, n in steps:
            c.add_metric([step, status], n)
        yield c
        c = CounterMetricFamily("gpuobs_remediation_events", "Alerts received, by outcome.", labels=["outcome"])
        for outcome, n in events:
            c.add_metric([outcome], n)
        yield c
        g = GaugeMetricFamily("gpuobs_remediation_mode", "1 for the controller's mode.", labels=["mode"])
        g.add_metric([self.c.cfg.mode], 1)
        yield g
        yield GaugeMetricFamily("gpuobs_remediation_last_tick_timestamp_seconds", "Unix time of the last loop tick.",
                                value=self.last_tick)


class RemediationServer(httpd.Server):
    def __init__(self, addr: tuple[str, int], controller: Controller, token: str | None):
        super().__init__(addr, Handler)
        self.controller, self.token = controller, token
        self.lock = threading.Lock()
        self.collector = StoreCollector(controller, self.lock)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)


class Handler(httpd.Handler):
    methods = {"GET": "_get", "POST": "_post"}
    logger = logging.getLogger("gpuobs.remediate.http")
    server: RemediationServer

    def _get(self) -> None:
        url = urlsplit(self.path)
        srv = self.server
        if url.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif url.path == "/metrics":
            self.send_body(200, generate_latest(srv.registry), "text/plain; version=0.0.4; charset=utf-8")
        elif url.path == "/api/status":
            with srv.lock:
                doc = srv.controller.status()
            self.send_json(200, doc)
        elif url.path == "/api/timeline":
            q = parse_qs(url.query)
            node = (q.get("node") or [None])[0]
            with srv.lock:
                doc = srv.controller.store.timeline(node=node)
            self.send_json(200, {"timeline": doc})
        else:
            self.send_error_json(404, f"no route {url.path}; GET /api/status, /api/timeline, /metrics, /health")

    def _post(self) -> None:
        path = urlsplit(self.path).path
        if path != "/hook/remediate":
            self.discard_body()
            self.send_error_json(404, f"no route {path}; POST to /hook/remediate")
            return
        payload = webhook.read_payload(self, self.server.token, "gpuobs-remediate", _log)
        if payload is None:
            return
        with self.server.lock:
            outcomes = self.server.controller.ingest(payload)
        _log.info("webhook", extra={"fields": {"outcomes": outcomes}})
        self.send_json(200, {"outcomes": outcomes})


class Loop:
    """Ticks the controller every ``interval_s`` on a daemon thread until :meth:`stop`."""

    def __init__(self, server: RemediationServer, interval_s: float):
        self.server, self.interval_s = server, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="remediate-loop", daemon=True)

    def start(self) -> "Loop":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.server.lock:
                    self.server.controller.tick()
                self.server.collector.last_tick = time.time()
            except Exception:  # noqa: BLE001 - the loop must survive any one bad tick; it is logged
                _log.exception("remediation tick failed")
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def serve(host: str, port: int, controller: Controller, token: str | None, interval_s: float = 1.0,
          ready: Any = None) -> None:
    """Run until SIGTERM/SIGINT. ``ready``: called with the bound server once it listens (tests)."""
    srv = RemediationServer((host, port), controller, token)
    done = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    loop = Loop(srv, interval_s).start()
    _log.info("remediation controller listening", extra={"fields": {
        "addr": f"{host}:{srv.server_address[1]}", "mode": controller.cfg.mode, "db": str(Path(controller.store.path))}})
    if ready is not None:
        ready(srv, done)
    done.wait()
    loop.stop()
    srv.shutdown()
    srv.server_close()
    controller.store.close()
