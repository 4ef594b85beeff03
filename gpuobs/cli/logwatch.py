"""``gpuobs logwatch``: run the kernel-log agent on a node.

``register(subparsers)`` adds the command group; ``cmd_logwatch(args)`` runs it and returns the
exit code (2 for user errors such as a bad flag combination, a damaged state file or mapping
file; 1 when the source cannot be opened or the port is taken).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
from pathlib import Path

from gpuobs.cli.common import HelpFormatter, fail

SOURCES = ("kmsg", "journal", "file", "sim")


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer port 0..65535, got {text!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port 0..65535, got {v}")
    return v


def _interval(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be seconds (0.05..60), got {text!r}") from None
    if not 0.05 <= v <= 60:
        raise argparse.ArgumentTypeError(f"must be seconds between 0.05 and 60, got {v}")
    return v


def register(sub) -> argparse.ArgumentParser:
    """Add ``logwatch`` to an argparse subparsers object; returns its parser."""
    p = sub.add_parser(
        "logwatch", help="node agent: count NVRM Xid/SXid/fallen-off-the-bus kernel-log lines, serve /metrics",
        formatter_class=HelpFormatter,
        description="Follow the kernel log (/dev/kmsg, journalctl -k, a file, or a simulated node), count the "
                    "NVIDIA driver's Xid, SXid and fallen-off-the-bus lines per GPU, and serve them on /metrics. "
                    "The position and counters are saved in --state-file after every batch, so a restart neither "
                    "loses nor double-counts a line. See docs/logwatch.md.")
    p.add_argument("--source", choices=SOURCES, default="kmsg", help="where to read the kernel log")
    p.add_argument("--path", default=None, help="file to follow (--source file; /dev/kmsg path for kmsg)")
    p.add_argument("--url", default=None, help="simulated node base URL, e.g. http://127.0.0.1:9400 (--source sim)")
    p.add_argument("--token-file", default=None, help="admin bearer token file of the simulated node (--source sim)")
    p.add_argument("--journalctl", default="journalctl", help="journalctl binary (--source journal)")
    p.add_argument("--start-at", choices=("end", "beginning"), default=None,
                   help="where to start without a saved position (default: end for kmsg/journal, beginning for file/sim)")
    p.add_argument("--state-file", required=True, help="JSON file holding the position and counters")
    p.add_argument("--host", default="127.0.0.1", help="listen address")
    p.add_argument("--port", type=_port, default=9500, help="listen port for /metrics and /health")
    p.add_argument("--hostname", default=os.environ.get("NODE_NAME") or socket.gethostname(),
                   help="value of the host label (like dcgm-exporter: NODE_NAME, else the host name)")
    p.add_argument("--hostname-label", choices=("Hostname", "hostname"), default="Hostname",
                   help="host label name: released dcgm-exporter uses Hostname, newer master hostname")
    p.add_argument("--gpu-map", default=None,
                   help="CSV from `nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv` (used when NVML is absent)")
    p.add_argument("--no-nvml", action="store_true", help="do not ask NVML for the bus id -> index/UUID map")
    p.add_argument("--interval", type=_interval, default=1.0, help="seconds between polls when the log is idle")
    p.set_defaults(func=cmd_logwatch)
    return p


def cmd_logwatch(args: argparse.Namespace) -> int:
    from gpuobs.core import log
    from gpuobs.logwatch import sources as src
    from gpuobs.logwatch.agent import Agent, LogwatchServer
    from gpuobs.logwatch.identity import GpuMap, MapError, load_map_file, load_nvml
    from gpuobs.logwatch.state import StateError

    _log = log.get("logwatch")

    if args.source == "file":
        if not args.path:
            return fail("--source file needs --path FILE")
        source = src.FileSource(Path(args.path), args.start_at or "beginning")
    elif args.source == "kmsg":
        source = src.KmsgSource(args.path or "/dev/kmsg", args.start_at or "end")
    elif args.source == "journal":
        source = src.JournalSource(args.journalctl, args.start_at or "end")
    else:
        if not args.url or not args.token_file:
            return fail("--source sim needs --url URL and --token-file FILE")
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            return fail(f"--token-file {args.token_file}: {exc.strerror or exc}")
        source = src.SimSource(args.url, token, args.start_at or "beginning")
    try:
        file_map = load_map_file(Path(args.gpu_map)) if args.gpu_map else {}
    except MapError as exc:
        return fail(str(exc))
    nvml = {} if args.no_nvml else load_nvml()
    agent = Agent(source, Path(args.state_file), args.hostname, args.hostname_label, GpuMap(nvml, file_map))
    try:
        agent.start()
    except StateError as exc:
        return fail(str(exc))
    except src.SourceError as exc:
        return fail(str(exc), 1)
    try:
        server = LogwatchServer((args.host, args.port), agent)
    except OSError as exc:
        source.close()
        return fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", 1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    _log.info("logwatch started", extra={"fields": {"source": source.describe(), "listen": f"{args.host}:{server.server_address[1]}",
                                                    "state_file": args.state_file, "gpus_mapped": len(nvml) or len(file_map),
                                                    "map": "nvml" if nvml else ("file" if file_map else "log")}})
    try:
        agent.run(stop, args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
        source.close()
    return 0
