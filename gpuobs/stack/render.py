"""Render the repository's Prometheus and Alertmanager configs into a run directory.

The files under ``prometheus/`` and ``alertmanager/`` are the source of truth (the compose stack and a
real fleet use them as they are); the native stack rewrites only what differs locally: listen ports,
absolute paths to rules and file_sd targets, the pager's webhook URLs and the runbook base URL.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuobs.rulegen import RUNBOOK_BASE
from gpuobs.slo_rules import parse_duration, render_slo_rules

#: Stack profiles. ``default`` loads the repository's rule files as they are (realistic ``for:``
#: durations and windows, 30-day SLO). ``drill`` is for rehearsing every failure quickly
#: (``make drills``): every ``for:`` longer than DRILL_MAX_FOR is cut to it, every range selector of
#: 5 minutes or more is divided by DRILL_WINDOW_DIVISOR (10m -> 2m), and the SLO rules are
#: regenerated for a DRILL_SLO_PERIOD SLO period, which shrinks the burn-rate windows proportionally
#: (1d: 2m/30s x14.4 and 12m/1m x6 page; 144m/12m x1 ticket). Production rule files are never modified.
PROFILES = ("default", "drill")
DRILL_MAX_FOR = "20s"
DRILL_WINDOW_DIVISOR = 5
DRILL_SLO_PERIOD = "1d"

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Ports:
    """Listen ports of the native stack (all on 127.0.0.1)."""

    prometheus: int = 9090
    alertmanager: int = 9093
    pager: int = 9097
    node_base: int = 9400
    engine_base: int = 8000
    grafana: int = 3000
    #: First port of the per-node logwatch agents; 0 = free loopback ports chosen at start-up.
    logwatch_base: int = 0


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` via a temp file and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_targets(run: Path, job: str, targets: list[tuple[str, int, dict[str, str]]]) -> Path:
    """Write the file_sd file of ``job`` (``dcgm``, ``vllm`` or ``logwatch``): ``[(hostname, port, extra labels)]``.

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


def _cap_for(text: str, cap: str) -> str:
    """Replace every ``for: <duration>`` longer than ``cap`` with ``cap`` (drill profile)."""
    limit = parse_duration(cap)

    def sub(m: re.Match) -> str:
        return f"{m.group(1)}for: {cap}" if parse_duration(m.group(2)) > limit else m.group(0)
    return re.sub(r"(?m)^(\s*)for: ([0-9dhms]+)\s*$", sub, text)


def _shorten_windows(text: str, divisor: int) -> str:
    """Divide every PromQL range selector of 5 minutes or more by ``divisor`` (drill profile)."""
    def sub(m: re.Match) -> str:
        secs = parse_duration(m.group(1))
        return f"[{secs // divisor}s]" if secs >= 300 else m.group(0)
    return re.sub(r"\[([0-9]+[dhms](?:[0-9]+[dhms])*)\]", sub, text)


def render_rules(out: Path, runbook_base: str, profile: str = "default", repo: Path = REPO_ROOT) -> list[Path]:
    """Copy the rule files into ``out`` with the runbook base applied and, for ``drill``, shortened."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    written = []
    for rule_file in sorted((repo / "prometheus" / "rules").glob("*.yml")):
        if profile == "drill" and rule_file.name == "slo.yml":
            text = render_slo_rules(repo / "prometheus" / "slo.yaml", DRILL_SLO_PERIOD)
        elif profile == "drill" and rule_file.name == "gpu-kernel-log.yml":
            # Its "recent Xid" span is a constant, not a range selector: shorten it like the windows.
            from gpuobs.logwatch.rules import RECENT_S, render as render_kernel_log
            text = render_kernel_log(RECENT_S // DRILL_WINDOW_DIVISOR)
        else:
            text = rule_file.read_text()
        if profile == "drill":
            text = _cap_for(text, DRILL_MAX_FOR)
            if rule_file.name != "slo.yml":  # the SLO file is regenerated for its own period instead
                text = _shorten_windows(text, DRILL_WINDOW_DIVISOR)
        text = text.replace(RUNBOOK_BASE, runbook_base.rstrip("/"))
        atomic_write(out / rule_file.name, text)
        written.append(out / rule_file.name)
    return written


def render_prometheus(run: Path, ports: Ports, nodes: list[tuple[str, int]], engines: list[tuple[str, int]],
                      runbook_base: str, profile: str = "default", repo: Path = REPO_ROOT) -> Path:
    """Write ``run/prometheus/{prometheus.yml,rules/*.yml,targets/*.json}``; returns the config path.

    ``nodes``/``engines`` are ``[(hostname, port), ...]`` for the DCGM and vLLM jobs; ``profile`` is
    one of :data:`PROFILES`.
    """
    out = run / "prometheus"
    cfg = yaml.safe_load((repo / "prometheus" / "prometheus.yml").read_text())
    cfg["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": [f"127.0.0.1:{ports.alertmanager}"]}]}]
    cfg["rule_files"] = [str(out / "rules" / "*.yml")]
    for sc in cfg["scrape_configs"]:
        if sc["job_name"] in ("dcgm", "vllm", "logwatch"):
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


def render_alertmanager(run: Path, ports: Ports, repo: Path = REPO_ROOT) -> Path:
    """Write ``run/alertmanager/alertmanager.yml`` with webhook URLs pointing at the pager's port."""
    cfg = yaml.safe_load((repo / "alertmanager" / "alertmanager.yml").read_text())
    for rcv in cfg.get("receivers", []):
        for wh in rcv.get("webhook_configs", []):
            path = wh["url"].split("/", 3)[3]
            wh["url"] = f"http://127.0.0.1:{ports.pager}/{path}"
    out = run / "alertmanager" / "alertmanager.yml"
    atomic_write(out, yaml.safe_dump(cfg, sort_keys=False))
    return out
