"""HTTP server of one simulated node: ``/metrics``, ``/health`` and the fault admin API.

Admin API (loopback clients only, ``Authorization: Bearer <token>``):

* ``GET /admin/faults`` -> 200 ``{"faults": [...]}``
* ``POST /admin/faults`` with ``{"kind": ..., "gpu": ..., <params>}`` -> 201 with the fault;
  400 ``{"error": ..., "field": ...}`` for bad JSON or parameters; 413 over 64 KiB
* ``DELETE /admin/faults/<id>`` -> 200 with the cleared fault, 404 if unknown
* ``GET /admin/kernel-log[?from=N]`` -> 200 text, the node's simulated dmesg lines (NVRM Xid lines in
  the driver's formats) from line N on, with ``X-Boot-Id`` and ``X-Kernel-Log-Lines`` headers
* ``GET /admin/flags`` -> ``{"hostname": ..., "flags": {"spec_decode": false, ...}}``: every catalogue
  flag as the engine evaluates it now (OpenFeature over the flag file; all false without one)
* ``GET /admin/deploy`` -> ``{"version": ...}``; ``POST /admin/deploy`` with ``{"version": "1.5.0"}``
  -> 200 ``{"version": ..., "previous": ...}``; unknown version -> 400 naming the known ones
* ``GET /admin/node`` -> 200 the node's action state (:meth:`Node.status`: gpu_model, driver_version,
  installed_driver, cordoned, cordoned_by, draining, in_flight, drained, boot_id, rebooting,
  reloading_driver, down, engine_generation, ...)
* ``POST /admin/node`` with ``{"action": "cordon"|"uncordon"|"drain"|"reset-gpu"|"reboot"|
  "restart-engine"|"diag"|"install-driver", "by": "gpuobs"|"human" (cordon/uncordon; default human),
  "gpu": N (reset-gpu: required; diag: optional), "downtime_s": S (reboot; default 30), "reason": "..."
  (cordon/uncordon/drain; optional), "version": "570.172.08" (install-driver: required, a version of
  the node's driver catalogue), "reload_s": S (install-driver; default 20)}`` -> 200: reset-gpu
  ``{"ok": bool, "detail": ...}``, diag ``{"passed": bool, "failures": [...]}``, reboot and
  restart-engine the status with ``detail``, install-driver the status with ``changed``, ``previous``
  and ``detail``, the others the status. 400 ``{"error", "field"}`` for a bad body (an unknown driver
  version lists the catalogue's) or an action the node's role cannot take (restart-engine on a
  training node); 409 when the node's state forbids it now (rebooting, reloading its driver or down;
  restart-engine or install-driver with a GPU off the bus; install-driver on a node not cordoned or
  not drained). Validation: :mod:`gpuobs.exporter.sim.actions`.

The serving engine's port serves only ``/metrics`` and ``/health`` (``admin=False``).

Missing or wrong token -> 401; a non-loopback client -> 403. Handler errors are answered with 500
and logged; they never stop the server or the simulation.
"""

from __future__ import annotations

import hmac
import ipaddress
import threading
import time
from urllib.parse import parse_qs

from gpuobs.core import httpd, log
from gpuobs.exporter.exposition import CONTENT_TYPE, Family, label_string, render
from gpuobs.exporter.sim import actions as actionmod
from gpuobs.exporter.sim import faults as faultmod
from gpuobs.exporter.sim.node import Node

MAX_BODY_BYTES = 64 * 1024
_log = log.get("exporter")


class NodeServer(httpd.Server):
    """An HTTP server bound to one node, with its collector, token and scrape counters."""

    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], node: Node, token: str, collector, admin: bool = True):
        super().__init__(addr, Handler)
        self.node = node
        self.token = token
        self.collector = collector
        self.admin = admin
        self.stats_lock = threading.Lock()
        self.scrapes = 0
        self.last_collect_s = 0.0
        self._generation = node.exporter_generation  # a replaced exporter starts its counters at 0

    def metrics_page(self) -> bytes:
        """Render the node's page, plus exporter self-metrics (docs/metrics.md) when the collector's profile
        carries them (a stock dcgm-exporter page has none)."""
        start = time.perf_counter()
        fams = self.collector.collect()
        # The engine page has no host label of its own (vLLM's has none; its scrape target adds
        # Hostname), so its self-metrics carry none either, or Prometheus would rename it.
        host = list(getattr(self.collector, "host_pairs", [])) if self.admin else []
        with self.stats_lock:
            if self.admin and self.node.exporter_generation != self._generation:
                self._generation, self.scrapes = self.node.exporter_generation, 0
            self.scrapes += 1
            if getattr(self.collector, "self_metrics", True):
                fams.append(Family("gpuobs_exporter_scrapes_total", "counter",
                                   "Scrapes of this node's /metrics since start.", True,
                                   [(label_string(host), self.scrapes)]))
                fams.append(Family("gpuobs_exporter_collect_duration_seconds", "gauge",
                                   "Duration of the previous collection, seconds.", False,
                                   [(label_string(host), self.last_collect_s)]))
            body = render(fams).encode()
            self.last_collect_s = time.perf_counter() - start
        return body


class Handler(httpd.Handler):
    """Request handler; see the module docstring for the routes (HTTP plumbing: :mod:`gpuobs.core.httpd`)."""

    server: NodeServer
    server_version = "gpuobs-exporter"
    max_body_bytes = MAX_BODY_BYTES
    methods = {"GET": "_get", "POST": "_post", "DELETE": "_delete"}
    logger = _log

    def _authorized(self) -> bool:
        """Loopback client with the right bearer token; otherwise answers 403/401 (body discarded) and False."""
        try:
            loopback = ipaddress.ip_address(self.client_address[0]).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            self.discard_body()
            self.send_error_json(403, "admin API accepts loopback clients only")
            return False
        header = self.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else ""
        if not given or not hmac.compare_digest(given.encode(), self.server.token.encode()):
            self.discard_body()
            self.send_error_json(401, "missing or wrong bearer token",
                                 headers={"WWW-Authenticate": 'Bearer realm="gpuobs-admin"'})
            return False
        return True

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        node = self.server.node
        if path == "/metrics":
            if (node.exporter_unavailable if self.server.admin else node.engine_down):  # the page's process is gone
                self.close_connection = True
                return
            self.send_body(200, self.server.metrics_page(), CONTENT_TYPE)
        elif path == "/health":
            self.send_json(200, {"status": "ok", "hostname": node.hostname, "down": node.down})
        elif not self.server.admin:
            self.send_error_json(404, f"no route {path}")
        elif path == "/admin/deploy":
            if self._authorized():
                self.send_json(200, {"hostname": node.hostname, "version": node.version})
        elif path == "/admin/faults":
            if self._authorized():
                self.send_json(200, {"hostname": node.hostname, "faults": node.list_faults()})
        elif path == "/admin/flags":
            if self._authorized():
                self.send_json(200, {"hostname": node.hostname, "flags": node.refresh_flags()})
        elif path == "/admin/kernel-log":
            if self._authorized():
                self._kernel_log(node)
        elif path == "/admin/node":
            if self._authorized():
                self.send_json(200, node.status())
        else:
            self.send_error_json(404, f"no route {path}")

    def _kernel_log(self, node: Node) -> None:
        """``?from=N``: lines N.. (0-based; default 0). Headers ``X-Boot-Id`` (new per node start) and
        ``X-Kernel-Log-Lines`` (lines in the log) let a follower resume without loss or duplicates."""
        query = parse_qs(self.path.split("?", 1)[1]) if "?" in self.path else {}
        raw = query.get("from", ["0"])[-1]
        if not raw.isdigit():
            self.send_error_json(400, f"query parameter 'from' must be a line number >= 0, got {raw!r}", "from")
            return
        with node.lock:
            lines, total, boot = node.kernel_log[int(raw):], len(node.kernel_log), node.boot_id
        body = "".join(line + "\n" for line in lines).encode()
        self.send_body(200, body, "text/plain; charset=utf-8",
                       headers={"X-Boot-Id": boot, "X-Kernel-Log-Lines": str(total)})

    def _post(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/admin/faults", "/admin/deploy", "/admin/node") or not self.server.admin:
            self.discard_body()
            self.send_error_json(404, f"no route {path}")
            return
        if not self._authorized():
            return
        body = self.read_json()
        if body is httpd.INVALID:
            return
        node = self.server.node
        if path == "/admin/deploy":
            self._deploy(body)
            return
        if path == "/admin/node":
            self._node_action(body)
            return
        try:
            req = faultmod.validate(body, len(node.gpus), node.cfg.role)
        except faultmod.FaultError as exc:
            self.send_error_json(400, str(exc), exc.field)
            return
        fault = node.inject(req)
        _log.info("fault injected", extra={"fields": {"hostname": node.hostname, **fault.to_dict()}})
        self.send_json(201, {**fault.to_dict(), "hostname": node.hostname, "role": node.cfg.role})

    def _deploy(self, body: object) -> None:
        node = self.server.node
        known = ", ".join(node.releases.releases)
        if not isinstance(body, dict) or set(body) != {"version"} or not isinstance(body["version"], str):
            self.send_error_json(400, f'body must be {{"version": "<one of {known}>"}}', "version")
            return
        try:
            previous = node.deploy(body["version"])
        except KeyError:
            self.send_error_json(400, f"field 'version' must be one of {known}; got {body['version']!r}", "version")
            return
        _log.info("deployed", extra={"fields": {"hostname": node.hostname, "version": body["version"],
                                                "previous": previous}})
        self.send_json(200, {"hostname": node.hostname, "version": body["version"], "previous": previous})

    def _node_action(self, body: object) -> None:
        node = self.server.node
        try:
            act = actionmod.validate(body, len(node.gpus), tuple(node.drivers.drivers))
            if act.action == "cordon":
                result = node.cordon(act.by, act.reason)
            elif act.action == "uncordon":
                result = node.uncordon(act.by)
            elif act.action == "drain":
                result = node.drain(act.reason)
            elif act.action == "reset-gpu":
                ok, detail = node.reset_gpu(act.gpu)
                result = {"ok": ok, "detail": detail}
            elif act.action == "reboot":
                detail = node.reboot(act.downtime_s)
                result = {**node.status(), "detail": detail}
            elif act.action == "restart-engine":
                detail = node.restart_engine()
                result = {**node.status(), "detail": detail}
            elif act.action == "install-driver":
                result = node.install_driver(act.version, act.reload_s)
            else:
                result = node.diag(act.gpu)
        except actionmod.NodeActionError as exc:
            self.send_error_json(400, str(exc), exc.field)
            return
        except actionmod.NodeStateError as exc:
            self.send_error_json(409, str(exc))
            return
        _log.info("node action", extra={"fields": {"hostname": node.hostname, "action": act.action, "by": act.by,
                                                   "gpu": act.gpu, "reason": act.reason,
                                                   **({"version": act.version} if act.version else {}),
                                                   "ok": result.get("ok", result.get("passed", True))}})
        self.send_json(200, result)

    def _delete(self) -> None:
        path = self.path.split("?", 1)[0]
        prefix = "/admin/faults/"
        if not self.server.admin or not path.startswith(prefix) or len(path) == len(prefix):
            self.discard_body()
            self.send_error_json(404, f"no route {path}")
            return
        if not self._authorized():
            return
        node = self.server.node
        fault = node.clear(path[len(prefix):])
        if fault is None:
            self.send_error_json(404, f"no active fault with id {path[len(prefix):]!r}", "id")
            return
        _log.info("fault cleared", extra={"fields": {"hostname": node.hostname, "id": fault.id}})
        self.send_json(200, fault.to_dict())
