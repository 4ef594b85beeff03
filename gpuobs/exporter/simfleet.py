"""Run N simulated nodes in one process, each on its own 127.0.0.1 ports, with a shared ticker.

Node ``i`` serves its DCGM page and admin API on ``base_port + i`` and, for serving nodes, its
engine page on ``engine_base_port + i``. The last ``training_nodes`` nodes run the training role (H100);
the serving nodes' GPU models follow ``gpu_models`` (``H100:19,L40S:1``, in node order; default H100). A ticker thread advances every node by the wall-clock time
elapsed since the previous tick (default tick 1 s), so the simulation runs in real time while the
physics stays deterministic per tick for tests that call :meth:`Node.advance` directly.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuobs.core import log
from gpuobs.core.files import atomic_write
from gpuobs.core.fleet import shipped_fleet
from gpuobs.exporter.collectors.dcgm import DcgmCollector, K8sMap
from gpuobs.exporter.collectors.vllm import EngineCollector
from gpuobs.exporter.server import NodeServer
from gpuobs.exporter.sim import profiles
from gpuobs.exporter.sim.behaviour import load as load_releases
from gpuobs.exporter.sim.engine import EngineConfig
from gpuobs.exporter.sim.gpu import H100_SXM, parse_gpu_models
from gpuobs.exporter.sim.mig import MigProfile
from gpuobs.exporter.sim.node import Node, NodeConfig
from gpuobs.flags.evaluate import FlagEvaluator
from gpuobs.reference.drivers import load as load_drivers

_log = log.get("exporter")


def load_or_create_token(token: str | None, token_file: Path) -> str:
    """Return the admin token: ``token`` if given, else the file's content, else a new random one.

    A new token is written atomically (temp file + rename) with mode 0600. Raises ValueError if the
    file exists but is empty.
    """
    if token:
        return token
    if token_file.exists():
        value = token_file.read_text().strip()
        if not value:
            raise ValueError(f"admin token file {token_file} is empty")
        return value
    token_file.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(32)
    tmp = token_file.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    os.replace(tmp, token_file)
    return value


@dataclass
class SimFleetSpec:
    """SimFleet-wide settings; see ``gpuobs exporter --help`` for each flag."""

    nodes: int = 4
    gpus: int = 8
    base_port: int = 9400
    seed: int = 1
    host: str = "127.0.0.1"
    host_prefix: str = "gpu-node"
    driver_version: str = "550.54.15"
    host_label_mode: str = "Hostname"
    exporter_profile: str = "stock"
    clock_events_name: str = "canonical"
    collect_interval_s: float = 0.0
    #: file_sd file of the DCGM targets in ServiceMonitor shape: the fleet rewrites a node's ``pod``
    #: target label when its exporter pod is replaced (as Kubernetes discovery would).
    targets_file: Path | None = None
    xid_window_ms: int = 300_000
    tick_s: float = 1.0
    engine_base_port: int | None = 8000
    training_nodes: int = 0
    node_offset: int = 0
    rate_rps: float = 4.0
    mig: dict[int, MigProfile] | None = None
    k8s: K8sMap | None = None
    releases_file: Path | None = None
    #: flagd-format flag file the engines evaluate (gpuobs.flags); None: every flag off.
    flags_file: Path | None = None
    #: GPU models of the serving nodes, ``SHORT:COUNT,...`` in node order (gpuobs.exporter.sim.gpu.GPU_MODELS;
    #: the counts sum to the serving nodes); "" = every node H100. Training nodes are H100.
    gpu_models: str = ""
    #: Driver catalogue ``install-driver`` accepts (gpuobs.reference.drivers); None: packaged.
    drivers_file: Path | None = None


def load_k8s_map(path: Path) -> K8sMap:
    """Read a GPU -> pod mapping file (YAML or JSON)::

        gpu-node-00:
          0: {pod: llama-0, namespace: serving, container: vllm}

    Raises ValueError naming the bad entry; only ``pod``, ``namespace``, ``container`` are allowed.
    """
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"--k8s-map {path}: cannot read it as YAML/JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: top level must map hostnames to GPU entries")
    out: K8sMap = {}
    for host, gpus in doc.items():
        if not isinstance(gpus, dict):
            raise ValueError(f"{path}: {host}: must map GPU indexes to {{pod, namespace, container}}")
        out[str(host)] = {}
        for idx, labels in gpus.items():
            if isinstance(idx, str) and idx.isdigit():  # JSON object keys are strings
                idx = int(idx)
            if not isinstance(idx, int) or not isinstance(labels, dict):
                raise ValueError(f"{path}: {host}: GPU key {idx!r} must be an integer index with a mapping value")
            bad = set(labels) - {"pod", "namespace", "container"}
            if bad or not all(isinstance(v, str) for v in labels.values()):
                raise ValueError(f"{path}: {host}.{idx}: allowed keys pod, namespace, container (strings); got {sorted(labels)}")
            out[str(host)][idx] = labels
    return out


class SimFleet:
    """The running fleet: nodes, their servers and the ticker. ``start()`` then ``stop()``."""

    def __init__(self, cfg: SimFleetSpec, token: str):
        self.cfg = cfg
        now = time.time()
        releases = load_releases(cfg.releases_file)
        drivers = load_drivers(cfg.drivers_file)
        first_training = cfg.node_offset + cfg.nodes - cfg.training_nodes
        models = parse_gpu_models(cfg.gpu_models, cfg.nodes - cfg.training_nodes) + [H100_SXM] * cfg.training_nodes
        self.nodes = [Node(NodeConfig(index=i, gpus=cfg.gpus, seed=cfg.seed, host_prefix=cfg.host_prefix,
                                      role="training" if i >= first_training else "serving",
                                      driver_version=cfg.driver_version, xid_window_ms=cfg.xid_window_ms,
                                      start_time=now, engine=EngineConfig(rate_rps=cfg.rate_rps),
                                      model=models[i - cfg.node_offset]), releases, drivers)
                      for i in range(cfg.node_offset, cfg.node_offset + cfg.nodes)]
        self.profile = profiles.load(cfg.exporter_profile, cfg.clock_events_name)
        self.flag_eval = FlagEvaluator(cfg.flags_file) if cfg.flags_file is not None else None
        for node in self.nodes:
            node.flag_source = self.flag_eval.enabled if self.flag_eval else None
        self.servers: list[NodeServer] = []
        try:
            for i, node in enumerate(self.nodes):
                dcgm = DcgmCollector(node, cfg.host_label_mode, cfg.mig, cfg.k8s, profile=self.profile,
                                     collect_interval_s=cfg.collect_interval_s)
                self.servers.append(NodeServer((cfg.host, cfg.base_port + i), node, token, dcgm, True))
                if node.engine is not None and cfg.engine_base_port is not None:
                    self.servers.append(NodeServer((cfg.host, cfg.engine_base_port + i), node, token,
                                                   EngineCollector(node), False))
        except OSError:
            for s in self.servers:
                s.server_close()
            raise
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: Wall seconds each recent tick spent advancing every node (the bench reads it).
        self.tick_seconds: collections.deque[float] = collections.deque(maxlen=3600)
        self._pods = {n.hostname: n.exporter_pod for n in self.nodes}

    def start(self) -> None:
        """Start one serving thread per node and the ticker thread."""
        for s in self.servers:
            t = threading.Thread(target=s.serve_forever, name=f"node-{s.node.hostname}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._tick, name="ticker", daemon=True)
        t.start()
        self._threads.append(t)

    def _tick(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.cfg.tick_s):
            now = time.monotonic()
            for node in self.nodes:
                node.advance(now - last)
            last = now
            if self.cfg.targets_file is not None:
                self._sync_pod_labels()
            self.tick_seconds.append(time.monotonic() - now)

    def _sync_pod_labels(self) -> None:
        """Rewrite the ``pod`` target label of nodes whose exporter pod was replaced since the last tick
        (only targets whose ``node`` and old ``pod`` match; other labels, e.g. a rollout's, are kept)."""
        changed = {n.hostname: (self._pods[n.hostname], n.exporter_pod) for n in self.nodes
                   if n.exporter_pod != self._pods[n.hostname]}
        if not changed:
            return
        path = Path(self.cfg.targets_file)
        try:
            groups = json.loads(path.read_text())
            for g in groups:
                old_new = changed.get(g.get("labels", {}).get(shipped_fleet().identity_label))
                if old_new and g["labels"].get("pod") == old_new[0]:
                    g["labels"]["pod"] = old_new[1]
            atomic_write(path, json.dumps(groups, indent=2) + "\n")
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            _log.warning("cannot update the pod labels of the targets", extra={"fields": {"file": str(path),
                                                                                          "error": str(exc)}})
            return
        for host, (_old, new) in changed.items():
            self._pods[host] = new

    def stop(self) -> None:
        """Stop the ticker and every server; idempotent."""
        self._stop.set()
        # shutdown() waits up to one poll interval (0.5 s) per server: wait for all of them at once.
        waiters = [threading.Thread(target=s.shutdown, daemon=True) for s in self.servers]
        for t in waiters:
            t.start()
        for t in waiters:
            t.join()
        for s in self.servers:
            s.server_close()
        if self.flag_eval is not None:
            self.flag_eval.close()

    def run_forever(self) -> None:
        """Start, then block until SIGTERM/SIGINT, then stop cleanly."""
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        self.start()
        _log.info("fleet serving", extra={"fields": {
            "nodes": self.cfg.nodes, "gpus": self.cfg.gpus,
            "ports": f"{self.cfg.base_port}-{self.cfg.base_port + self.cfg.nodes - 1}"}})
        done.wait()
        self.stop()
        _log.info("fleet stopped")
