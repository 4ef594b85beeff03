"""The native stack's state file, ``<run>/stack.json``, as a typed value.

Written by the supervisor on ``up`` (after each component starts) and ``down``; read by every command
that acts on a running stack (fault, drill, rollout, report). The JSON shape is::

    {"run_dir": "/abs/.run", "started_at": 1760000000.0, "ports": {"prometheus": 9090, ...},
     "nodes": 4, "gpus": 8, "seed": 1, "training_nodes": 1, "profile": "default",
     "exporter_profile": "stock", "host_label_mode": "Hostname", "scrape_mode": "file_sd",
     "hostnames": ["gpu-node-00", ...], "token_file": "/abs/.run/admin-token",
     "urls": {"prometheus": "http://127.0.0.1:9090", "alertmanager": ..., "pager": ..., "grafana": null,
              "nodes": ["http://127.0.0.1:9400/metrics", ...], "engines": [...]},
     "components": {"exporter": {"pid": 123, "argv": [...], "log": "/abs/.run/logs/exporter.log"}, ...},
     "topology": "single", "members": {}, "gpu_models": {"gpu-node-00": "NVIDIA H100 80GB HBM3", ...},
     "drivers_file": ""}

The HA topology (gpuobs.stack.ha) records ``"topology": "ha"`` and ``members``, the base URL of each
Prometheus replica, Alertmanager member, VictoriaMetrics and vmalert by component name.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuobs.core.errors import InputError
from gpuobs.core.files import atomic_write

FILE_NAME = "stack.json"
#: The model of every node of a stack.json that records none (gpuobs.exporter.sim.gpu.H100_SXM's name).
DEFAULT_GPU_MODEL = "NVIDIA H100 80GB HBM3"


class StateError(InputError):
    """stack.json is unreadable or not the shape the supervisor writes (exit 2: delete it and start again)."""


@dataclass
class Component:
    """One started process: its pid, exact argv (checked before signalling it) and log file."""

    pid: int
    argv: list[str]
    log: str = ""
    #: The component's own /metrics URL where it has one of its own (a logwatch agent).
    url: str = ""


@dataclass
class StackUrls:
    """Base URLs of the stack's services (node and engine entries are their /metrics URLs)."""

    prometheus: str
    alertmanager: str
    pager: str
    nodes: list[str]
    engines: list[str] = field(default_factory=list)
    grafana: str | None = None
    #: One kernel-log agent per node (``gpuobs logwatch``), /metrics URLs in node order; empty without them.
    logwatch: list[str] = field(default_factory=list)
    #: The remediation controller (``gpuobs remediate serve``), None when the stack runs none.
    remediate: str | None = None

    @property
    def node_bases(self) -> list[str]:
        """Node base URLs (admin API), ``http://127.0.0.1:9400``."""
        return [u.removesuffix("/metrics") for u in self.nodes]


@dataclass
class StackState:
    """Everything ``stack.json`` records; see the module docstring."""

    run_dir: str
    urls: StackUrls
    hostnames: list[str]
    token_file: str
    nodes: int
    gpus: int = 8
    training_nodes: int = 0
    seed: int = 1
    profile: str = "default"
    #: Exporter profile, host-label mode and scrape mode of the simulated fleet (docs/metrics.md).
    exporter_profile: str = "stock"
    host_label_mode: str = "Hostname"
    scrape_mode: str = "file_sd"
    started_at: float = 0.0
    ports: dict[str, int] = field(default_factory=dict)
    components: dict[str, Component] = field(default_factory=dict)
    #: ``native`` (processes this supervisor started) or ``compose`` (containers; see gpuobs.stack.compose).
    mode: str = "native"
    #: Whether every node runs a logwatch agent (then the kernel-log alerts page; drills expect them).
    logwatch: bool = False
    #: compose mode: the node containers, in node order (their admin APIs are reached with docker exec).
    containers: list[str] = field(default_factory=list)
    #: ``single`` (one Prometheus, one Alertmanager) or ``ha`` (gpuobs.stack.ha: Prometheus shards x
    #: replicas, an Alertmanager cluster, VictoriaMetrics and vmalert; ``urls.prometheus`` is then
    #: VictoriaMetrics's Prometheus API, the global view, and ``urls.alertmanager`` the first member).
    topology: str = "single"
    #: ha: base URL of every member by component name (``prometheus-s0-r1``, ``alertmanager-2``,
    #: ``victoria-metrics``, ``vmalert``).
    members: dict[str, str] = field(default_factory=dict)
    #: The base of the runbook links in the stack's rules (its pager's URL unless the fleet config sets
    #: one): notices the stack's rollouts send link there too.
    runbook_base: str = ""
    #: Hostname -> GPU model name (dcgm-exporter's ``modelName``) of every node (``--gpu-models``). Empty in
    #: a stack.json written before mixed fleets: every node was an H100 (:meth:`gpu_model`).
    gpu_models: dict[str, str] = field(default_factory=dict)
    #: The driver catalogue the nodes' ``install-driver`` accepts (``--drivers``, an absolute path); ``""``:
    #: the packaged one (:mod:`gpuobs.reference.drivers`).
    drivers_file: str = ""

    @property
    def running(self) -> bool:
        """Whether any component (or, in compose mode, container) is recorded (``down`` clears them)."""
        return bool(self.components or self.containers)

    @property
    def serving_hosts(self) -> list[str]:
        """Hostnames of the serving nodes (the training nodes are the last ``training_nodes``)."""
        return self.hostnames[: self.nodes - self.training_nodes]

    def gpu_model(self, host: str) -> str:
        """The GPU model name (``NVIDIA L40S``) of node ``host``: as recorded, else H100 (what every node of
        a stack that recorded none ran). KeyError naming the known hosts for a host not in the stack."""
        if host not in self.hostnames:
            raise KeyError(f"unknown host {host!r}; known: {', '.join(self.hostnames)}")
        return self.gpu_models.get(host, DEFAULT_GPU_MODEL)

    def hosts_by_model(self) -> dict[str, list[str]]:
        """GPU model name -> its hostnames in node order (every node, serving and training)."""
        out: dict[str, list[str]] = {}
        for h in self.hostnames:
            out.setdefault(self.gpu_model(h), []).append(h)
        return out

    def token(self) -> str:
        """The exporter admin token (read from ``token_file``). Raises OSError if it cannot be read."""
        return Path(self.token_file).read_text().strip()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Any) -> StackState:
        """Parse the JSON document; raises StateError naming the first bad field."""
        if not isinstance(doc, dict):
            raise StateError("not a JSON object")
        comps = doc.get("components")
        if not isinstance(comps, dict) or not isinstance(doc.get("urls"), dict):
            raise StateError("missing 'components' or 'urls'")
        components = {}
        for name, c in comps.items():
            if (not isinstance(c, dict) or not isinstance(c.get("pid"), int) or not isinstance(c.get("argv"), list)
                    or not c["argv"] or not all(isinstance(a, str) for a in c["argv"])):
                raise StateError(f"component {name!r} has no valid pid/argv")
            components[name] = Component(c["pid"], list(c["argv"]), str(c.get("log", "")), str(c.get("url", "")))
        u = doc["urls"]
        try:
            urls = StackUrls(prometheus=str(u["prometheus"]), alertmanager=str(u["alertmanager"]), pager=str(u["pager"]),
                             nodes=[str(x) for x in u["nodes"]], engines=[str(x) for x in u.get("engines") or []],
                             grafana=u.get("grafana"), logwatch=[str(x) for x in u.get("logwatch") or []],
                             remediate=str(u["remediate"]) if u.get("remediate") else None)
            return cls(run_dir=str(doc["run_dir"]), urls=urls, hostnames=[str(h) for h in doc["hostnames"]],
                       token_file=str(doc["token_file"]), nodes=int(doc["nodes"]), gpus=int(doc.get("gpus", 8)),
                       training_nodes=int(doc.get("training_nodes", 0)), seed=int(doc.get("seed", 1)),
                       profile=str(doc.get("profile", "default")),
                       exporter_profile=str(doc.get("exporter_profile", "stock")),
                       host_label_mode=str(doc.get("host_label_mode", "Hostname")),
                       scrape_mode=str(doc.get("scrape_mode", "file_sd")), started_at=float(doc.get("started_at", 0.0)),
                       ports={str(k): int(v) for k, v in (doc.get("ports") or {}).items()}, components=components,
                       mode=str(doc.get("mode", "native")), logwatch=bool(doc.get("logwatch", False)),
                       containers=[str(c) for c in doc.get("containers") or []],
                       topology=str(doc.get("topology", "single")),
                       members={str(k): str(v) for k, v in (doc.get("members") or {}).items()},
                       runbook_base=str(doc.get("runbook_base", "")),
                       gpu_models={str(k): str(v) for k, v in (doc.get("gpu_models") or {}).items()},
                       drivers_file=str(doc.get("drivers_file") or ""))
        except KeyError as exc:
            raise StateError(f"missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise StateError(f"a field has the wrong type ({exc})") from None


def load(run_dir: Path) -> StackState | None:
    """``run_dir``'s stack.json, or None if there is none. Raises StateError if it is damaged."""
    path = run_dir / FILE_NAME
    if not path.exists():
        return None
    hint = f"{path} is damaged ({{}}); if no stack is running from {run_dir}, delete it and start again"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StateError(hint.format(exc)) from None
    try:
        return StackState.from_dict(doc)
    except StateError as exc:
        raise StateError(hint.format(exc)) from None


def save(state: StackState) -> None:
    """Write ``state`` to its run directory's stack.json atomically."""
    atomic_write(Path(state.run_dir) / FILE_NAME, json.dumps(state.to_dict(), indent=2))
