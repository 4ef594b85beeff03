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
from gpuobs.mixin.profile import profile_rules


@dataclass(frozen=True)
class Ports:
    """Listen ports of the native stack (all on 127.0.0.1)."""

    prometheus: int = 9090
    alertmanager: int = 9093
    pager: int = 9097
    node_base: int = 9400
    engine_base: int = 8000
    grafana: int = 3000


def write_targets(run: Path, job: str, targets: list[tuple[str, int, dict[str, str]]]) -> Path:
    """Write the file_sd file of ``job`` (``dcgm`` or ``vllm``): ``[(hostname, port, extra labels)]``.

    Each target is labelled ``node=<hostname>`` plus the extra labels (e.g. ``track``). Written
    atomically, so Prometheus never reads half a file.
    """
    # The vLLM page has no host label of its own, so its targets also carry `Hostname` (the DCGM page
    # brings its own, which a target label would clash with): serving alerts group and inhibit by it.
    host_label = "Hostname" if job == "vllm" else None
    doc = [{"targets": [f"127.0.0.1:{port}"],
            "labels": {"node": host, **({host_label: host} if host_label else {}), **extra}}
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


def render_prometheus(run: Path, ports: Ports, nodes: list[tuple[str, int]], engines: list[tuple[str, int]],
                      runbook_base: str, profile: str = "default", repo: Path | None = None) -> Path:
    """Write ``run/prometheus/{prometheus.yml,rules/*.yml,targets/*.json}``; returns the config path.

    ``nodes``/``engines`` are ``[(hostname, port), ...]`` for the DCGM and vLLM jobs; ``profile`` is
    one of :data:`PROFILES`.
    """
    repo = repo or assets.root()
    out = run / "prometheus"
    cfg = yaml.safe_load((repo / "prometheus" / "prometheus.yml").read_text())
    cfg["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": [f"127.0.0.1:{ports.alertmanager}"]}]}]
    cfg["rule_files"] = [str(out / "rules" / "*.yml")]
    for sc in cfg["scrape_configs"]:
        if sc["job_name"] in ("dcgm", "vllm"):
            sc["file_sd_configs"] = [{"files": [str(out / "targets" / f"{sc['job_name']}-*.json")],
                                      "refresh_interval": "5s"}]
        elif sc["job_name"] == "prometheus":
            sc["static_configs"] = [{"targets": [f"127.0.0.1:{ports.prometheus}"]}]
    render_rules(out / "rules", runbook_base, profile, repo)
    write_targets(run, "dcgm", [(h, p, {}) for h, p in nodes])
    write_targets(run, "vllm", [(h, p, {}) for h, p in engines])
    path = out / "prometheus.yml"
    atomic_write(path, yaml.safe_dump(cfg, sort_keys=False))
    return path


def render_alertmanager(run: Path, ports: Ports, repo: Path | None = None, pager_token_file: Path | None = None,
                        resolve_timeout: str | None = None) -> Path:
    """Write ``run/alertmanager/alertmanager.yml`` with webhook URLs pointing at the pager's port.

    ``pager_token_file``: every webhook gets ``http_config.authorization`` (type Bearer,
    ``credentials_file``), so Alertmanager authenticates to the pager with the token in that file
    (prometheus/common ``config.HTTPClientConfig``, read by Alertmanager 0.25 at each request).
    ``resolve_timeout``: replaces ``global.resolve_timeout`` (see :mod:`gpuobs.stack.alert_timing`).
    """
    repo = repo or assets.root()
    cfg = yaml.safe_load((repo / "alertmanager" / "alertmanager.yml").read_text())
    if resolve_timeout:
        cfg.setdefault("global", {})["resolve_timeout"] = resolve_timeout
    for rcv in cfg.get("receivers", []):
        for wh in rcv.get("webhook_configs", []):
            path = wh["url"].split("/", 3)[3]
            wh["url"] = f"http://127.0.0.1:{ports.pager}/{path}"
            if pager_token_file is not None:
                wh["http_config"] = {"authorization": {"type": "Bearer", "credentials_file": str(pager_token_file)}}
    out = run / "alertmanager" / "alertmanager.yml"
    atomic_write(out, yaml.safe_dump(cfg, sort_keys=False))
    return out
