"""Render the repository's Prometheus and Alertmanager configs into a run directory.

The files under ``prometheus/`` and ``alertmanager/`` are the source of truth (the compose stack and a
real fleet use them as they are); the native stack rewrites only what differs locally: listen ports,
absolute paths to rules and file_sd targets, the pager's webhook URLs and the runbook base URL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuobs.core import assets
from gpuobs.core.files import atomic_write
from gpuobs.core.fleet import shipped_fleet
from gpuobs.mixin.alertmanager import remediation_route
from gpuobs.exporter.scrape import file_sd_labels
from gpuobs.exporter.sim import k8s
from gpuobs.mixin.profile import profile_rules


@dataclass(frozen=True)
class Ports:
    """Listen ports of the native stack (all on 127.0.0.1)."""

    prometheus: int = 9090
    alertmanager: int = 9093
    pager: int = 9097
    #: The remediation controller (``gpuobs remediate serve``).
    remediate: int = 9098
    node_base: int = 9400
    engine_base: int = 8000
    grafana: int = 3000
    #: First port of the per-node logwatch agents; 0 = free loopback ports chosen at start-up.
    logwatch_base: int = 0


def write_targets(run: Path, job: str, targets: list[tuple[str, int, dict[str, str]]]) -> Path:
    """Write the file_sd file of ``job`` (``dcgm``, ``vllm`` or ``logwatch``): ``[(hostname, port, extra labels)]``.

    Each target is labelled ``node=<hostname>`` plus the extra labels (e.g. ``track``, or the
    ServiceMonitor-style labels of :func:`gpuobs.exporter.sim.k8s.target_labels`). Written
    atomically, so Prometheus never reads half a file.
    """
    # The vLLM page has no host label of its own, so file_sd vLLM targets also carry `Hostname` (the
    # DCGM page brings its own, which a target label would clash with): serving alerts group and
    # inhibit by it. ServiceMonitor-shaped targets (they carry `service`) are left as Kubernetes gives them.
    doc = [{"targets": [f"127.0.0.1:{port}"],
            "labels": {**(file_sd_labels(job, host) if "service" not in extra
                       else {shipped_fleet().identity_label: host}), **extra}}
           for host, port, extra in targets]
    path = run / "prometheus" / "targets" / f"{job}-nodes.json"
    atomic_write(path, json.dumps(doc, indent=2) + "\n")
    return path


def render_rules(out: Path, runbook_base: str, profile: str = "default", repo: Path | None = None) -> list[Path]:
    """Write the rule files of ``profile`` (:func:`gpuobs.mixin.profile.profile_rules`) into ``out``."""
    written = []
    for name, text in profile_rules(runbook_base, profile, repo or assets.root()).items():
        atomic_write(out / name, text)
        written.append(out / name)
    return written


def scrape_pools(scrape_mode: str = "file_sd") -> tuple[str, str]:
    """Scrape-config names (Prometheus ``scrapePool``) of the DCGM and vLLM targets under ``scrape_mode``:
    ``dcgm``/``vllm`` for file_sd; prometheus-operator's ``serviceMonitor/<namespace>/<name>/<endpoint
    index>`` for servicemonitor. Raises ValueError for another mode."""
    if scrape_mode == "file_sd":
        return ("dcgm", "vllm")
    if scrape_mode == "servicemonitor":
        return tuple(f"serviceMonitor/{svc['namespace']}/{svc['service']}/0"  # type: ignore[return-value]
                     for svc in (k8s.DCGM_SERVICE, k8s.ENGINE_SERVICE))
    raise ValueError(f"scrape mode must be one of {', '.join(k8s.SCRAPE_MODES)}; got {scrape_mode!r}")


def render_prometheus(run: Path, ports: Ports, nodes: list[tuple[str, int]], engines: list[tuple[str, int]],
                      runbook_base: str, profile: str = "default", repo: Path | None = None,
                      scrape_mode: str = "file_sd", pods: dict[str, tuple[str, str]] | None = None) -> Path:
    """Write ``run/prometheus/{prometheus.yml,rules/*.yml,targets/*.json}``; returns the config path.

    ``nodes``/``engines`` are ``[(hostname, port), ...]`` for the DCGM and vLLM jobs; ``profile`` is
    one of :data:`PROFILES`. ``scrape_mode``: ``file_sd`` (targets labelled ``node``, jobs ``dcgm``
    and ``vllm``) or ``servicemonitor`` (targets labelled as a kube-prometheus ServiceMonitor scrape
    labels them, plus ``node``; ``pods``: hostname -> (exporter pod, engine pod) names, required).
    """
    dcgm_pool, vllm_pool = scrape_pools(scrape_mode)
    if scrape_mode == "servicemonitor" and pods is None:
        raise ValueError("scrape mode servicemonitor needs the pod names (pods=)")
    repo = repo or assets.root()
    out = run / "prometheus"
    cfg = yaml.safe_load((repo / "prometheus" / "prometheus.yml").read_text())
    cfg["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": [f"127.0.0.1:{ports.alertmanager}"]}]}]
    cfg["rule_files"] = [str(out / "rules" / "*.yml")]
    for sc in cfg["scrape_configs"]:
        if sc["job_name"] in ("dcgm", "vllm", "logwatch"):
            sc["file_sd_configs"] = [{"files": [str(out / "targets" / f"{sc['job_name']}-*.json")],
                                      "refresh_interval": "5s"}]
            # Under servicemonitor the scrape config carries prometheus-operator's name; the `job`
            # target label (the Service name) comes with each target, as the operator's relabelling sets it.
            sc["job_name"] = {"dcgm": dcgm_pool, "vllm": vllm_pool}.get(sc["job_name"], sc["job_name"])
        elif sc["job_name"] == "prometheus":
            sc["static_configs"] = [{"targets": [f"127.0.0.1:{ports.prometheus}"]}]
    render_rules(out / "rules", runbook_base, profile, repo)
    if scrape_mode == "servicemonitor":
        assert pods is not None
        write_targets(run, "dcgm", [(h, p, k8s.target_labels("dcgm", h, f"127.0.0.1:{p}", pods[h][0]))
                                    for h, p in nodes])
        write_targets(run, "vllm", [(h, p, k8s.target_labels("vllm", h, f"127.0.0.1:{p}", pods[h][1]))
                                    for h, p in engines])
    else:
        write_targets(run, "dcgm", [(h, p, {}) for h, p in nodes])
        write_targets(run, "vllm", [(h, p, {}) for h, p in engines])
    path = out / "prometheus.yml"
    atomic_write(path, yaml.safe_dump(cfg, sort_keys=False))
    return path


def render_alertmanager(run: Path, ports: Ports, repo: Path | None = None, pager_token_file: Path | None = None,
                        resolve_timeout: str | None = None, remediate: bool = False,
                        pager_host: str = "127.0.0.1") -> Path:
    """Write ``run/alertmanager/alertmanager.yml`` with webhook URLs pointing at the pager's port.

    ``pager_host``: the pager's host in those URLs (the compose profile ``ha`` passes the service name
    ``pager``: its Alertmanager members have their own network namespaces).
    ``pager_token_file``: every webhook gets ``http_config.authorization`` (type Bearer,
    ``credentials_file``), so Alertmanager authenticates to the pager with the token in that file
    (prometheus/common ``config.HTTPClientConfig``, read by Alertmanager 0.25 at each request).
    ``resolve_timeout``: replaces ``global.resolve_timeout`` (see :mod:`gpuobs.stack.alert_timing`).
    ``remediate``: also route the alerts the remediation controller acts on to its webhook (port
    ``ports.remediate``, same bearer token) ahead of every other route, with ``continue: true`` so they
    still page or ticket (:func:`gpuobs.mixin.alertmanager.remediation_route`).
    """
    repo = repo or assets.root()
    cfg = yaml.safe_load((repo / "alertmanager" / "alertmanager.yml").read_text())
    if resolve_timeout:
        cfg.setdefault("global", {})["resolve_timeout"] = resolve_timeout
    if remediate:
        route, receiver = remediation_route(f"http://127.0.0.1:{ports.remediate}")  # gpuobs.mixin.alertmanager
        cfg["route"]["routes"].insert(0, route)
        cfg["receivers"].append(receiver)
    for rcv in cfg.get("receivers", []):
        for wh in rcv.get("webhook_configs", []):
            path = wh["url"].split("/", 3)[3]
            port = ports.remediate if rcv["name"] == "remediate" else ports.pager
            wh["url"] = f"http://{pager_host}:{port}/{path}"
            if pager_token_file is not None:
                wh["http_config"] = {"authorization": {"type": "Bearer", "credentials_file": str(pager_token_file)}}
    out = run / "alertmanager" / "alertmanager.yml"
    atomic_write(out, yaml.safe_dump(cfg, sort_keys=False))
    return out
