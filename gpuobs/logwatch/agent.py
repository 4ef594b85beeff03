"""The logwatch agent: follow a source, parse, count, persist, and serve ``/metrics``.

Metrics (prometheus_client custom collector over the persisted counts; GPU identity labels as in
dcgm-exporter: ``gpu``, ``UUID``, ``pci_bus_id`` and the host label, ``Hostname`` by default):

* ``gpuobs_xid_events_total{gpu,UUID,pci_bus_id,GPU_I_ID,xid,xid_severity,xid_action}`` counter:
  ``NVRM: Xid`` lines. ``xid_severity`` (critical|warning|info|unknown) and ``xid_action`` (the
  catalogue's immediate action, e.g. RESET_GPU) are functions of ``xid``, so they add no series.
  ``GPU_I_ID`` is the MIG GPU instance the driver attributed the Xid to (empty otherwise).
* ``gpuobs_xid_last_event_timestamp_seconds{same labels}`` gauge: unix time the agent counted the
  latest such line (rules use it for "an Xid in the last N minutes": it is right from the first
  event, where ``increase()`` on a brand-new counter series is not, and a restart does not move it).
* ``gpuobs_gpu_fallen_off_bus{gpu,UUID,pci_bus_id}`` gauge 0/1: Xid 79 or "GPU has fallen off the
  bus" seen since the host booted; 0 for every other GPU the agent knows.
* ``gpuobs_gpu_recovery_action{gpu,UUID,pci_bus_id,action}`` gauge: the NV2080_CTRL_GPU_RECOVERY_ACTION
  value of the GPU's latest Xid 154 this boot (0 None, 1 GPU Reset Required, 2 Node Reboot Required,
  3 Drain P2P, 4 Drain and Reset, 5 Recover IMEX Domain); ``action`` is the driver's name for it.
* ``gpuobs_sxid_events_total{device,pci_bus_id,sxid,sxid_fatal}`` counter and
  ``gpuobs_sxid_last_event_timestamp_seconds``: NVSwitch SXid event lines (detail lines excluded).
* Agent health: ``gpuobs_logwatch_lines_total``, ``gpuobs_logwatch_unparsed_lines_total`` (lines
  with an NVRM/SXid marker in no known format, and undecodable records),
  ``gpuobs_logwatch_lost_lines_total`` (kmsg overrun), ``gpuobs_logwatch_read_errors_total``,
  ``gpuobs_logwatch_source_up``, ``gpuobs_logwatch_position`` (byte offset / kmsg seq / sim line;
  absent for the journal, whose position is a cursor), ``gpuobs_logwatch_last_line_timestamp_seconds``,
  ``gpuobs_logwatch_info{source}``.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from gpuobs.core import httpd, log
from gpuobs.logwatch import parser as P
from gpuobs.logwatch import state as S
from gpuobs.logwatch.identity import GpuMap
from gpuobs.logwatch.sources import SourceError
from gpuobs.reference import xid as xidcat

_log = log.get("logwatch")
_ACTION_RE = re.compile(r"immediate:\s*\(?([A-Z][A-Z0-9_]+)")


def xid_labels(code: int) -> tuple[str, str]:
    """(severity, immediate action token) of an Xid from the catalogue; ("unknown", "UNKNOWN") if absent."""
    info = xidcat.catalog().get(code)
    if info is None:
        return "unknown", "UNKNOWN"
    m = _ACTION_RE.search(info.recommended_action)
    return info.severity, (m.group(1) if m else "UNKNOWN")


class Agent:
    """Follows ``source``, keeps counts in memory and in ``state_path`` (saved with the position after
    every batch), and exposes them through :meth:`collect` (a prometheus_client collector).

    Raises :class:`gpuobs.logwatch.state.StateError` from :meth:`start` for an unusable state file,
    :class:`SourceError` if the source cannot be opened at all.
    """

    def __init__(self, source, state_path: Path, hostname: str, hostname_label: str = "Hostname",
                 gpu_map: GpuMap | None = None, clock=time.time):
        self.source = source
        self.state_path = Path(state_path)
        self.hostname = hostname
        self.hostname_label = hostname_label
        self.gpu_map = gpu_map or GpuMap()
        self.clock = clock
        self.lock = threading.Lock()
        self.counts = S.Counts()
        self.parser = P.Parser()
        self.source_up = False
        self.read_errors = 0
        self._saved_position: dict | None = None
        self._last_error = ""

    # ---- loop -------------------------------------------------------------------------------
    def start(self) -> None:
        position, self.counts = S.load(self.state_path, self.source.kind)
        self._saved_position = position
        self.source.start(position)

    def poll_once(self, max_lines: int = 10000) -> int:
        """Read what the source has now, count it, persist; returns the number of lines read."""
        try:
            batch = self.source.read_batch(max_lines)
        except SourceError as exc:
            with self.lock:
                self.source_up = False
                self.read_errors += 1
            if str(exc) != self._last_error:
                _log.warning("source read failed", extra={"fields": {"error": str(exc)}})
                self._last_error = str(exc)
            return 0
        now = self.clock()
        with self.lock:
            if self._last_error:
                _log.info("source readable again", extra={"fields": {"source": self.source.describe()}})
                self._last_error = ""
            self.source_up = True
            c = self.counts
            if batch.new_boot:
                c.new_boot()
                self.parser = P.Parser()
            for line in batch.lines:
                self._apply(self.parser.parse(line), now)
            c.lines += len(batch.lines) + batch.bad
            c.unparsed += batch.bad
            c.lost += batch.lost
            if batch.lines:
                c.last_line_at = now
            position = self.source.position
            if batch.lines or batch.bad or batch.lost or batch.new_boot or position != self._saved_position:
                S.save(self.state_path, self.source.kind, position, c)
                self._saved_position = position
        return len(batch.lines)

    def _apply(self, ev: P.Event, now: float) -> None:
        c = self.counts
        if ev.kind == P.IGNORED:
            return
        if ev.kind == P.XID:
            key = (ev.pci_bus_id, "" if ev.gpu_instance is None else str(ev.gpu_instance), ev.code)
            slot = c.xid.setdefault(key, [0, 0.0])
            slot[0] += 1
            slot[1] = now
            if ev.code == 79:
                c.fallen.setdefault(ev.pci_bus_id, now)
            if ev.code == 154 and ev.recovery_action is not None:
                c.recovery[ev.pci_bus_id] = ev.recovery_action
            _log.info("xid", extra={"fields": {"pci_bus_id": ev.pci_bus_id, "xid": ev.code, "pid": ev.pid,
                                               "process": ev.process, "message": ev.message[:200]}})
        elif ev.kind == P.FALLEN_OFF_BUS:
            c.fallen.setdefault(ev.pci_bus_id, now)
        elif ev.kind == P.GPU_UUID:
            c.uuids[ev.pci_bus_id] = ev.uuid
        elif ev.kind == P.SXID:
            if ev.fatal is None:
                return  # detail line of the event line before it
            key = (ev.device, ev.pci_bus_id, ev.code, "fatal" if ev.fatal else "non-fatal")
            slot = c.sxid.setdefault(key, [0, 0.0])
            slot[0] += 1
            slot[1] = now
        elif ev.kind == P.UNPARSED:
            c.unparsed += 1

    def run(self, stop: threading.Event, interval_s: float = 1.0) -> None:
        """Poll until ``stop`` is set; drains bursts at once, sleeps ``interval_s`` when idle."""
        while not stop.is_set():
            try:
                n = self.poll_once()
            except OSError as exc:  # e.g. the state directory became unwritable: keep going, say so
                _log.error("cannot save state", extra={"fields": {"error": str(exc), "path": str(self.state_path)}})
                n = 0
            if n == 0:
                stop.wait(interval_s)

    # ---- metrics ------------------------------------------------------------------------------
    def collect(self):
        h = self.hostname_label
        with self.lock:
            c = self.counts
            xid = [(k, list(v)) for k, v in c.xid.items()]
            sxid = [(k, list(v)) for k, v in c.sxid.items()]
            fallen, recovery, uuids = dict(c.fallen), dict(c.recovery), dict(c.uuids)
            lines, unparsed, lost, last = c.lines, c.unparsed, c.lost, c.last_line_at
            up, errors, pos = self.source_up, self.read_errors, dict(self._saved_position or {})
        gl = [h, "gpu", "UUID", "pci_bus_id"]

        def ident(bus: str) -> list[str]:
            g = self.gpu_map.resolve(bus, uuids)
            return [self.hostname, g.gpu, g.uuid, bus]

        xl = gl + ["GPU_I_ID", "xid", "xid_severity", "xid_action"]
        ev = CounterMetricFamily("gpuobs_xid_events_total", "NVRM Xid lines counted in the kernel log.", labels=xl)
        ts = GaugeMetricFamily("gpuobs_xid_last_event_timestamp_seconds",
                               "Unix time logwatch counted the latest NVRM Xid line of this GPU and code.", labels=xl)
        for (bus, gi, code), (n, t) in sorted(xid):
            labels = ident(bus) + [gi, str(code), *xid_labels(code)]
            ev.add_metric(labels, n)
            ts.add_metric(labels, t)
        yield ev
        yield ts
        fb = GaugeMetricFamily("gpuobs_gpu_fallen_off_bus",
                               "1 if the kernel log said this GPU fell off the bus (Xid 79) since boot.", labels=gl)
        for bus in sorted(self.gpu_map.known_buses(uuids) | set(fallen) | {k[0] for k, _ in xid}):
            fb.add_metric(ident(bus), 1 if bus in fallen else 0)
        yield fb
        ra = GaugeMetricFamily("gpuobs_gpu_recovery_action",
                               "NV2080_CTRL_GPU_RECOVERY_ACTION of the GPU's latest Xid 154 this boot "
                               "(0 None, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, 5 recover IMEX domain).",
                               labels=gl + ["action"])
        for bus, action in sorted(recovery.items()):
            ra.add_metric(ident(bus) + [P.RECOVERY_ACTIONS.get(action, "Unknown")], action)
        yield ra
        sl = [h, "device", "pci_bus_id", "sxid", "sxid_fatal"]
        sx = CounterMetricFamily("gpuobs_sxid_events_total", "NVSwitch SXid event lines counted in the kernel log.",
                                 labels=sl)
        st = GaugeMetricFamily("gpuobs_sxid_last_event_timestamp_seconds",
                               "Unix time logwatch counted the latest SXid event line of this switch and code.", labels=sl)
        for (dev, bus, code, fatal), (n, t) in sorted(sxid):
            labels = [self.hostname, dev, bus, str(code), fatal]
            sx.add_metric(labels, n)
            st.add_metric(labels, t)
        yield sx
        yield st
        host = [h]
        for name, doc, value, kind in (
            ("gpuobs_logwatch_lines_total", "Kernel-log lines read.", lines, CounterMetricFamily),
            ("gpuobs_logwatch_unparsed_lines_total",
             "Lines with an NVRM/SXid marker in no known format, plus undecodable records.", unparsed, CounterMetricFamily),
            ("gpuobs_logwatch_lost_lines_total", "Kernel records overwritten before logwatch read them (kmsg overrun).",
             lost, CounterMetricFamily),
            ("gpuobs_logwatch_read_errors_total", "Failed reads of the source.", errors, CounterMetricFamily),
            ("gpuobs_logwatch_source_up", "1 if the last read of the source succeeded.", 1 if up else 0, GaugeMetricFamily),
            ("gpuobs_logwatch_last_line_timestamp_seconds", "Unix time logwatch last read a line (0: none yet).",
             last, GaugeMetricFamily),
        ):
            m = kind(name, doc, labels=host)
            m.add_metric([self.hostname], value)
            yield m
        num = pos.get("offset", pos.get("seq", pos.get("line")))
        if isinstance(num, int):
            m = GaugeMetricFamily("gpuobs_logwatch_position",
                                  "Source position: byte offset (file), sequence number (kmsg) or line (sim).", labels=host)
            m.add_metric([self.hostname], num)
            yield m
        info = GaugeMetricFamily("gpuobs_logwatch_info", "The source logwatch follows (value 1).", labels=host + ["source"])
        info.add_metric([self.hostname, self.source.describe()], 1)
        yield info

    def registry(self) -> CollectorRegistry:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(self)
        return reg


class _Handler(httpd.Handler):
    """``/metrics`` (prometheus_client exposition) and ``/health``; HTTP plumbing: :mod:`gpuobs.core.httpd`."""

    server: "LogwatchServer"
    server_version = "gpuobs-logwatch"
    methods = {"GET": "_get"}
    logger = _log

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self.send_body(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path == "/health":
            a = self.server.agent
            self.send_json(200, {"status": "ok", "hostname": a.hostname, "source": a.source.describe(),
                                 "source_up": a.source_up, "lines": a.counts.lines})
        else:
            self.send_error_json(404, "no such route; try /metrics or /health")


class LogwatchServer(httpd.Server):
    """``/metrics`` and ``/health`` of one agent."""

    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], agent: Agent):
        super().__init__(addr, _Handler)
        self.agent = agent
        self.registry = agent.registry()
