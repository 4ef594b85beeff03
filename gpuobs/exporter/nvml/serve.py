"""HTTP server of the NVML source: ``/metrics`` (text format 0.0.4) and ``/health`` for this host's GPUs.

``gpuobs exporter --source nvml`` calls :func:`main_nvml`; without the CLI::

    gpuobs exporter --source nvml --host 127.0.0.1 --base-port 9400 [--hostname-label Hostname]

Scrapes are serialised by a lock (NVML reads and the Xid window are shared state); a scrape whose
collect raises is answered 500 with the reason and the server keeps serving. A poller thread drains
NVML Xid events every second so the Xid window counts events close to when they happened.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

from gpuobs.core import httpd, log
from gpuobs.core.errors import InputError
from gpuobs.exporter.exposition import CONTENT_TYPE, Family, label_string, render
from gpuobs.exporter.nvml.source import NvmlCollector, NvmlUnavailable

_log = log.get("exporter.nvml")
#: Seconds between Xid event polls of the background thread.
XID_POLL_INTERVAL_S = 1.0


class NvmlHTTPServer(httpd.Server):
    """HTTP server around one collector (anything with ``collect() -> list[Family]``)."""

    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], collector: Any):
        super().__init__(addr, _Handler)
        self.collector = collector
        self.scrape_lock = threading.Lock()
        self.scrapes = 0
        self.last_collect_s = 0.0

    def metrics_page(self) -> bytes:
        """The collector's families plus its self-metrics (docs/metrics.md), rendered. Raises what collect raises."""
        with self.scrape_lock:
            self.scrapes += 1
            start = time.perf_counter()
            try:
                fams = list(self.collector.collect())
            finally:
                previous, self.last_collect_s = self.last_collect_s, time.perf_counter() - start
            host = label_string([(getattr(self.collector, "hostname_label", "Hostname"),
                                  getattr(self.collector, "hostname", ""))])
            fams.append(Family("gpuobs_exporter_scrapes_total", "counter", "Scrapes of /metrics since start.",
                               True, [(host, self.scrapes)]))
            fams.append(Family("gpuobs_exporter_collect_duration_seconds", "gauge",
                               "Duration of the previous collection, seconds.", False, [(host, previous)]))
            return render(fams).encode()


class _Handler(httpd.Handler):
    """``/metrics`` and ``/health`` (HTTP plumbing: :mod:`gpuobs.core.httpd`)."""

    server: NvmlHTTPServer
    server_version = "gpuobs-nvml-exporter"
    methods = {"GET": "_get"}
    logger = _log

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_body(code, body, ctype)

    def _get(self) -> None:
        self._route(self.path.split("?", 1)[0])

    def _route(self, path: str) -> None:
        if path == "/metrics":
            try:
                body = self.server.metrics_page()
            except Exception as exc:
                _log.exception("collect failed")
                msg = f"collect failed: {type(exc).__name__}: {exc}\n".encode()
                self._send(500, msg, "text/plain; charset=utf-8")
                return
            self._send(200, body, CONTENT_TYPE)
        elif path == "/health":
            c = self.server.collector
            doc = {"status": "ok", "source": "nvml", "hostname": getattr(c, "hostname", ""),
                   "gpus": len(getattr(c, "gpus", [])), "expected_gpus": getattr(c, "expected_gpus", None)}
            self._send(200, (json.dumps(doc) + "\n").encode(), "application/json")
        else:
            self._send(404, f"no route {path}\n".encode(), "text/plain; charset=utf-8")


def make_server(host: str, port: int, collector: Any) -> NvmlHTTPServer:
    """Bind the server (port 0 picks a free one: see ``server_address``). Raises OSError."""
    return NvmlHTTPServer((host, port), collector)


def _poll_xids(collector: Any, stop: threading.Event) -> None:
    poll = getattr(collector, "poll_events", None)
    while poll is not None and not stop.wait(XID_POLL_INTERVAL_S):
        try:
            poll()
        except Exception:
            _log.exception("Xid event poll failed")


def serve(host: str, port: int, collector: Any, stop_event: threading.Event | None = None) -> None:
    """Serve ``collector`` on host:port until ``stop_event`` is set (or Ctrl-C). Raises OSError on bind."""
    srv = make_server(host, port, collector)
    stop = stop_event or threading.Event()
    threads = [threading.Thread(target=_poll_xids, args=(collector, stop), name="nvml-xid", daemon=True),
               threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, name="nvml-http",
                                daemon=True)]
    for t in threads:
        t.start()
    _log.info("NVML exporter listening", extra={"fields": {"host": host, "port": srv.server_address[1]}})
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        srv.shutdown()
        srv.server_close()


def main_nvml(host: str, port: int, hostname_label: str, nvml_module: Any = None,
              stop_event: threading.Event | None = None) -> int:
    """Run the NVML exporter until stopped; returns 0 after a clean stop.

    Raises :class:`gpuobs.core.errors.InputError` (exit 2) when NVML is unusable or the port cannot be bound."""
    try:
        collector = NvmlCollector(nvml_module, hostname_label=hostname_label)
    except NvmlUnavailable as exc:
        raise InputError(f"NVML source unavailable: {exc}") from None
    except ValueError as exc:
        raise InputError(str(exc)) from None
    stop = stop_event or threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve(host, port, collector, stop)
    except OSError as exc:
        raise InputError(f"cannot listen on {host}:{port}: {exc}") from None
    finally:
        collector.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0
