"""Native stack supervisor: ``gpuobs stack up|down|status``.

Starts, on 127.0.0.1, the simulated fleet (one process, one port per node), the pager, Alertmanager
and Prometheus (binaries from PATH: ``prometheus``; ``prometheus-alertmanager`` or ``alertmanager``),
with rendered configs, data, logs and pids under the run directory, and records everything in
``<run>/stack.json``. The run directory is mode 0700 and everything in it is created 0600/0700
(umask 077 for the supervisor's writes and every component), since it holds tokens, pages and
alert data.

``down`` stops every process of the stack, found by its recorded command line (any pid: a component
restarted by hand with the same argv is found too) and by the ports the stack owns (a process
listening on one of them that runs the same program); nothing else is ever signalled. ``restart``
stops one component that way and starts it again with its recorded argv. ``status`` reports a
component as running when any such process exists, with its current pid.

Alert-delivery flags (Prometheus resend delay and ``for`` grace period, Alertmanager notification-log
maintenance interval and resolve timeout) come from :mod:`gpuobs.stack.alert_timing`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import requests
import yaml

from gpuobs.core import assets, tokens
from gpuobs.core.durations import format_duration
from gpuobs.core.errors import Failure, InputError
from gpuobs.core.files import atomic_write
from gpuobs.exporter.sim import k8s, profiles
from gpuobs.exporter.sim.gpu import H100_SXM, parse_gpu_models
from gpuobs.exporter.sim.identity import exporter_pod_name, hostname
from gpuobs.flags.flagd import FILE_NAME as FLAGS_FILE
from gpuobs.flags.flagd import FlagFile, FlagFileError
from gpuobs.mixin.profile import PROFILES as RULE_PROFILES
from gpuobs.reference.drivers import DriverCatalogueError
from gpuobs.reference.drivers import load as load_drivers
from gpuobs.reference.releases import load as load_catalogue
from gpuobs.stack import alert_timing
from gpuobs.stack import state as state_file
from gpuobs.stack.grafana import find_grafana
from gpuobs.stack.grafana import render as render_grafana
from gpuobs.stack.ports import port_free
from gpuobs.stack.render import (
    Ports,
    render_alertmanager,
    render_prometheus,
    scrape_pools,
    write_targets,
)
from gpuobs.stack.state import Component, StackState, StackUrls

APT_HINT = ("install them with: apt-get install -y --no-install-recommends prometheus prometheus-alertmanager "
            "(Debian/Ubuntu, as root), or put the upstream binaries on PATH")


class StackError(Failure):
    """A stack operation failed; ``exit_code`` is 2 for user/setup errors, 1 otherwise."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class StackConfig:
    """What to start: run directory, fleet shape, ports and the runbook base URL."""

    run_dir: Path = Path(".run")
    nodes: int = 4
    gpus: int = 8
    training_nodes: int = 1
    seed: int = 1
    rate_rps: float = 4.0
    ports: Ports = field(default_factory=Ports)
    xid_window_ms: int = 15_000
    profile: str = "default"
    runbook_base: str | None = None
    timeout_s: float = 60.0
    #: One ``gpuobs logwatch`` per node on the node's simulated kernel log (job ``logwatch``).
    logwatch: bool = True
    #: What the simulated exporters serve (gpuobs.exporter.sim.profiles): stock | helm | recommended.
    exporter_profile: str = "stock"
    #: The DCGM pages' host label: Hostname | hostname | localhost | pod | none.
    host_label_mode: str = "Hostname"
    #: How Prometheus finds and labels the pages: file_sd | servicemonitor (gpuobs.exporter.sim.k8s).
    scrape_mode: str = "file_sd"
    #: DCGM's field update interval in seconds (0: fresh values on every scrape).
    collect_interval_s: float = 0.0
    #: Name of field 112 on the pages: canonical (DCGM_FI_DEV_CLOCKS_EVENT_REASONS) or legacy (..._CLOCK_THROTTLE_REASONS).
    clock_events_name: str = "canonical"
    #: The remediation controller's mode (``gpuobs remediate serve --mode``), or ``off`` to not start it.
    #: Single topology only. ``gpuobs stack up`` defaults to ``dry-run`` (GPUOBS_REMEDIATE).
    remediate: str = "off"
    #: The command the refusal to start over a running stack tells to run first (``make up`` says
    #: ``make down``); empty: ``gpuobs stack down --run-dir <run_dir>``.
    stop_hint: str = ""
    #: GPU models of the serving nodes, ``SHORT:COUNT,...`` in node order (``H100:19,L40S:1``; the counts
    #: sum to the serving nodes); "" = every node H100. Training nodes are H100.
    gpu_models: str = ""
    #: Driver catalogue file the exporter's install-driver accepts; None: the packaged one.
    drivers_file: Path | None = None


def find_binaries() -> dict[str, str]:
    """Paths of prometheus, promtool and Alertmanager; raises StackError(exit 2) naming what is missing."""
    found = {"prometheus": shutil.which("prometheus"),
             "alertmanager": shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")}
    missing = [k for k, v in found.items() if not v]
    if missing:
        raise StackError(f"missing binaries: {', '.join(missing)}; {APT_HINT}", 2)
    return found  # type: ignore[return-value]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def alive(pid: int, argv: list[str]) -> bool:
    """True if ``pid`` runs and its command line is exactly ``argv`` (guards against pid reuse; an
    empty or partial argv never matches, so a damaged stack.json cannot make us signal a stranger)."""
    if not isinstance(pid, int) or pid <= 1 or not argv:
        return False
    return _cmdline(pid) == list(argv)


def load_state(run_dir: Path) -> StackState | None:
    """The run directory's stack.json (:class:`~gpuobs.stack.state.StackState`), or None if there is none.

    Raises StackError (exit 2) if the file is unreadable or not the shape ``up`` writes, naming the
    problem, so a damaged file never turns into a traceback or a signal to the wrong process.
    """
    try:
        return state_file.load(run_dir)
    except state_file.StateError as exc:
        raise StackError(str(exc), 2) from None


def check_run_dir(run_dir: Path) -> Path:
    """Resolve and vet a run directory: not empty, not the repository (or above it), not a file.

    The stack renders configs and rules into it, so pointing it at the repository would overwrite
    the tracked sources. Raises StackError (exit 2).
    """
    if not str(run_dir).strip():
        raise StackError("--run-dir must not be empty", 2)
    run = run_dir.resolve()
    checkout = assets.checkout_root()
    if checkout is not None and (run == checkout or run in checkout.parents):
        raise StackError(f"--run-dir {run} is the gpuobs repository (or contains it); use a directory "
                         "of its own such as .run", 2)
    if run.exists() and not run.is_dir():
        raise StackError(f"--run-dir {run} exists and is not a directory", 2)
    return run


#: umask of everything the stack writes and starts: files 0600, directories 0700.
UMASK = 0o077


@contextmanager
def private_files() -> Iterator[None]:
    """Run the block with umask 077 (restored afterwards)."""
    old = os.umask(UMASK)
    try:
        yield
    finally:
        os.umask(old)


def _make_private(run: Path) -> None:
    """chmod the run directory 0700 (existing files inside are left to :func:`private_files`)."""
    run.mkdir(parents=True, exist_ok=True)
    os.chmod(run, 0o700)


def _wait(what: str, check, deadline: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise StackError(f"{what} exited with status {proc.returncode} during start-up; log {log}:\n{tail}")
        try:
            if check():
                return
        except requests.RequestException as exc:
            last = str(exc)
        time.sleep(0.3)
    raise StackError(f"timed out waiting for {what}{': ' + last if last else ''}")


def _ok(url: str) -> bool:
    return requests.get(url, timeout=2).status_code == 200


def _all_targets_up(prom: str, expected: int, pools: tuple[str, ...] = ("dcgm", "vllm")) -> bool:
    resp = requests.get(f"{prom}/api/v1/targets", params={"state": "active"}, timeout=2).json()
    nodes = [t for t in resp["data"]["activeTargets"] if t.get("scrapePool") in pools]
    return len(nodes) == expected and all(t["health"] == "up" for t in nodes)


def up(cfg: StackConfig, out=sys.stdout) -> StackState:
    """Start the stack and wait until Prometheus reports every node target up; returns the :class:`~gpuobs.stack.state.StackState`.

    Raises StackError: exit 2 for missing binaries, busy ports or a stack already running in the run
    directory; exit 1 when a component fails to start (the components already started are stopped).
    """
    with private_files():
        return _up(cfg, out)


@dataclass
class FleetProcesses:
    """The simulated fleet and the pager, shared by the single and the HA topologies: argv of the
    exporter, the logwatch agents and the pager (in start order), their health checks, and the node
    and engine ``(hostname, port)`` lists the scrape configs are rendered from."""

    specs: dict[str, list[str]]
    checks: dict
    nodes: list[tuple[str, int]]
    engines: list[tuple[str, int]]
    node_ports: list[int]
    engine_ports: list[int]
    pods: dict[str, tuple[str, str]] | None
    lw_urls: list[str]
    pager_url: str
    runbook_base: str
    pager_token_file: Path


#: ``StackConfig.remediate`` values: off, or a mode of gpuobs.remediate.config.MODES.
REMEDIATE_MODES = ("off", "observe", "dry-run", "enforce")


def check_config(cfg: StackConfig) -> Path:
    """Vet ``cfg`` and its run directory; returns the resolved run directory. Raises StackError (exit 2)
    for a bad value (naming the field and the allowed ones) or a stack already running there."""
    run = check_run_dir(cfg.run_dir)
    for what, value, allowed, where in (
            ("rule profile", cfg.profile, RULE_PROFILES, "--profile, GPUOBS_PROFILE"),
            ("exporter profile", cfg.exporter_profile, profiles.PROFILES, "--exporter-profile, GPUOBS_EXPORTER_PROFILE"),
            ("host label mode", cfg.host_label_mode, profiles.HOST_LABEL_MODES, "--host-label-mode, GPUOBS_HOST_LABEL_MODE"),
            ("scrape mode", cfg.scrape_mode, k8s.SCRAPE_MODES, "--scrape-mode, GPUOBS_SCRAPE_MODE"),
            ("clock events name", cfg.clock_events_name, profiles.CLOCK_EVENTS_NAMES, "--clock-events-name"),
            ("remediation mode", cfg.remediate, REMEDIATE_MODES, "--remediate, GPUOBS_REMEDIATE")):
        if value not in allowed:
            raise StackError(f"{what} must be one of {', '.join(allowed)}; got {value!r} ({where})", 2)
    if cfg.collect_interval_s < 0:
        raise StackError(f"collect interval must be >= 0 seconds; got {cfg.collect_interval_s:g}", 2)
    host_models(cfg)
    if cfg.drivers_file is not None:
        try:
            load_drivers(cfg.drivers_file)
        except DriverCatalogueError as exc:
            raise StackError(f"--drivers (GPUOBS_DRIVERS): {exc}", 2) from None
    old = load_state(run)
    if old and any(find_processes(old, name) for name in old.components):
        hint = cfg.stop_hint or f"gpuobs stack down --run-dir {cfg.run_dir}"
        raise StackError(f"a stack is already running from {run}; run `{hint}` first", 2)
    return run


def host_models(cfg: StackConfig) -> dict[str, str]:
    """Hostname -> modelName of every node ``cfg`` starts (serving nodes per ``cfg.gpu_models``, training
    nodes H100). Raises StackError (exit 2) naming ``--gpu-models`` for a bad spec or a wrong sum."""
    serving = cfg.nodes - cfg.training_nodes
    try:
        models = parse_gpu_models(cfg.gpu_models, serving, "--gpu-models (GPUOBS_GPU_MODELS)")
    except InputError as exc:
        raise StackError(str(exc), 2) from None
    models += [H100_SXM] * cfg.training_nodes
    return {hostname("gpu-node", i): m.name for i, m in enumerate(models)}


def check_ports(wanted: list[int], what: str) -> None:
    """Raise StackError (exit 2) if a port of ``wanted`` is past 65535, assigned twice or busy."""
    if max(wanted) > 65535:
        raise StackError(f"ports run past 65535 ({what})", 2)
    dupes = sorted({x for x in wanted if wanted.count(x) > 1})
    if dupes:
        raise StackError(f"the same port is assigned twice: {', '.join(map(str, dupes))}; give every component "
                         f"its own ({what})", 2)
    busy = [str(x) for x in wanted if not port_free(x)]
    if busy:
        raise StackError(f"ports already in use on 127.0.0.1: {', '.join(busy)}; choose others with the --*-port flags", 2)


def fleet_parts(cfg: StackConfig, run: Path, alertmanager_url: str, prometheus_url: str | None = None) -> FleetProcesses:
    """Write the fleet's files (admin/pager tokens, k8s map, logwatch GPU maps and targets) and return
    its :class:`FleetProcesses`. ``alertmanager_url``: where the pager creates silences. Raises StackError (exit
    2) for a token that cannot be made or busy logwatch ports."""
    p = cfg.ports
    node_ports = [p.node_base + i for i in range(cfg.nodes)]
    serving = cfg.nodes - cfg.training_nodes
    engine_ports = [p.engine_base + i for i in range(serving)]
    pager_token_file = run / "pager-token"
    try:
        tokens.load_or_create(pager_token_file)
    except tokens.TokenError as exc:
        raise StackError(str(exc), 2) from None
    nodes = [(hostname("gpu-node", i), port) for i, port in enumerate(node_ports)]
    engines = [(hostname("gpu-node", i), port) for i, port in enumerate(engine_ports)]
    pager_url = f"http://127.0.0.1:{p.pager}"
    runbook_base = cfg.runbook_base or pager_url
    exporter_extra = ["--exporter-profile", cfg.exporter_profile, "--host-label-mode", cfg.host_label_mode]
    # The engines' feature flags (flagd format; every catalogue flag off when first written, kept as
    # it is across restarts): `gpuobs flag rollout|kill` rewrite it, the engines evaluate it.
    flags_file = run / FLAGS_FILE
    try:
        FlagFile(flags_file).ensure(load_catalogue().flags)
    except (OSError, FlagFileError) as exc:
        raise StackError(f"flag file {flags_file}: {exc}", 2) from None
    exporter_extra += ["--flags", str(flags_file)]
    if cfg.collect_interval_s:
        exporter_extra += ["--collect-interval", f"{cfg.collect_interval_s:g}"]
    if cfg.clock_events_name != "canonical":
        exporter_extra += ["--clock-events-name", cfg.clock_events_name]
    if cfg.gpu_models:
        exporter_extra += ["--gpu-models", cfg.gpu_models]
    if cfg.drivers_file is not None:
        exporter_extra += ["--drivers", str(Path(cfg.drivers_file).resolve())]
    pods = None
    if cfg.scrape_mode == "servicemonitor":
        # Kubernetes shapes: exporter and engine pod names in the targets; the workload pods that own
        # the GPUs on the pages (stored by Prometheus as exported_pod/namespace/container).
        pods = {h: (exporter_pod_name(cfg.seed, i), k8s.engine_pod_name(cfg.seed, i)) for i, (h, _p) in enumerate(nodes)}
        roles = [(h, i, "serving" if i < serving else "training") for i, (h, _p) in enumerate(nodes)]
        k8s_map = run / "k8s-map.yaml"
        atomic_write(k8s_map, yaml.safe_dump(k8s.pod_map(roles, cfg.gpus, cfg.seed), sort_keys=True))
        exporter_extra += ["--k8s-map", str(k8s_map),
                           "--targets-file", str(run / "prometheus" / "targets" / "dcgm-nodes.json")]
    lw_specs, lw_checks, lw_urls = _logwatch_specs(cfg, run, nodes) if cfg.logwatch else ({}, {}, [])
    py = [sys.executable, "-m", "gpuobs"]
    specs = {
        "exporter": py + ["exporter", "--nodes", str(cfg.nodes), "--gpus", str(cfg.gpus), "--base-port", str(p.node_base),
                          "--seed", str(cfg.seed), "--token-file", str(run / "admin-token"),
                          "--xid-window-ms", str(cfg.xid_window_ms), "--engine-base-port", str(p.engine_base),
                          "--training-nodes", str(cfg.training_nodes), "--rate", str(cfg.rate_rps)] + exporter_extra,
        **lw_specs,  # the agents follow their nodes
        "pager": py + ["pager", "--port", str(p.pager), "--db", str(run / "pager.sqlite"),
                       "--runbooks-dir", str(assets.path("runbooks")), "--token-file", str(pager_token_file),
                       "--runbook-base", runbook_base, "--alertmanager-url", alertmanager_url,
                       *(["--prometheus-url", prometheus_url] if prometheus_url else [])],
    }
    checks = {
        **lw_checks,
        "exporter": lambda: all(_ok(f"http://127.0.0.1:{port}/health") for port in node_ports + engine_ports),
        "pager": lambda: _ok(f"{pager_url}/health"),
    }
    return FleetProcesses(specs, checks, nodes, engines, node_ports, engine_ports, pods, lw_urls, pager_url, runbook_base,
                 pager_token_file)


def start_components(state: StackState, specs: dict[str, list[str]], checks: dict, deadline: float, out,
                     envs: dict[str, dict] | None = None, urls: dict[str, str] | None = None) -> None:
    """Start ``specs`` in order, recording each in ``state`` (saved after each start) and waiting for its
    check before the next. ``urls``: a component's own URL to record (logwatch agents, HA members).
    Raises StackError when one exits or is not healthy by ``deadline`` (the caller stops the rest)."""
    run = Path(state.run_dir)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name, argv in specs.items():
        log = run / "logs" / f"{name}.log"
        proc = _spawn(argv, log, (envs or {}).get(name, env), run)
        state.components[name] = Component(proc.pid, argv, str(log), (urls or {}).get(name, ""))
        state_file.save(state)
        print(f"started {name:<17} pid {proc.pid}", file=out, flush=True)
        _wait(name, checks[name], deadline, proc, log)


def _up(cfg: StackConfig, out) -> StackState:
    run = check_config(cfg)
    bins = find_binaries()
    p = cfg.ports
    serving = cfg.nodes - cfg.training_nodes
    node_ports = [p.node_base + i for i in range(cfg.nodes)]
    engine_ports = [p.engine_base + i for i in range(serving)]
    if max(node_ports + engine_ports) > 65535:
        raise StackError(f"node ports run past 65535 (nodes from {p.node_base}, engines from {p.engine_base})", 2)
    remediate = cfg.remediate != "off"
    check_ports([p.prometheus, p.alertmanager, p.pager, *([p.remediate] if remediate else []), *node_ports,
                 *engine_ports],
                "--prometheus-port, --alertmanager-port, --pager-port, --remediate-port, --base-port, --engine-base-port")
    _make_private(run)
    for sub in ("logs", "prometheus/data", "alertmanager/data"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    timing = alert_timing.DEFAULT
    fleet = fleet_parts(cfg, run, f"http://127.0.0.1:{p.alertmanager}", f"http://127.0.0.1:{p.prometheus}")
    nodes, engines, lw_urls, pager_url = fleet.nodes, fleet.engines, fleet.lw_urls, fleet.pager_url
    prom_cfg = render_prometheus(run, p, nodes, engines, fleet.runbook_base, cfg.profile, scrape_mode=cfg.scrape_mode,
                                 pods=fleet.pods)
    am_cfg = render_alertmanager(run, p, pager_token_file=fleet.pager_token_file,
                                 resolve_timeout=format_duration(timing.resolve_timeout_s), remediate=remediate)
    remediate_url = f"http://127.0.0.1:{p.remediate}"
    if remediate:
        # After the exporter (its adapter reads stack.json's nodes), before Alertmanager (its webhook target).
        fleet.specs["remediate"] = [sys.executable, "-m", "gpuobs", "remediate", "serve", "--run-dir", str(run),
                                    "--port", str(p.remediate), "--token-file", str(fleet.pager_token_file),
                                    "--mode", cfg.remediate, "--prometheus", f"http://127.0.0.1:{p.prometheus}",
                                    "--alertmanager", f"http://127.0.0.1:{p.alertmanager}",
                                    "--runbook-base", fleet.runbook_base]
        fleet.checks["remediate"] = lambda: _ok(f"{remediate_url}/health")
        fleet.specs["pager"] += ["--remediate-url", remediate_url]
    specs = {
        **fleet.specs,
        "alertmanager": [bins["alertmanager"], f"--config.file={am_cfg}", f"--storage.path={run / 'alertmanager/data'}",
                         f"--web.listen-address=127.0.0.1:{p.alertmanager}", "--cluster.listen-address=",
                         f"--web.external-url=http://127.0.0.1:{p.alertmanager}", "--log.format=json",
                         *timing.alertmanager_flags()],
        "prometheus": [bins["prometheus"], f"--config.file={prom_cfg}", f"--storage.tsdb.path={run / 'prometheus/data'}",
                       f"--web.listen-address=127.0.0.1:{p.prometheus}", "--storage.tsdb.retention.time=7d",
                       f"--web.external-url=http://127.0.0.1:{p.prometheus}", "--log.format=json",
                       # Resend delay and `for` grace period derived so that a Prometheus outage of
                       # up to 5 min never resolves a firing alert (gpuobs/stack/alert_timing.py).
                       *timing.prometheus_flags()],
    }
    checks = {
        **fleet.checks,
        "alertmanager": lambda: _ok(f"http://127.0.0.1:{p.alertmanager}/-/ready"),
        "prometheus": lambda: _ok(f"http://127.0.0.1:{p.prometheus}/-/ready"),
    }
    envs: dict[str, dict] = {}
    grafana_cmd = find_grafana()
    if grafana_cmd:
        if not port_free(p.grafana):
            raise StackError(f"port {p.grafana} (Grafana) already in use on 127.0.0.1; choose another with --grafana-port", 2)
        g_argv, envs["grafana"] = render_grafana(run, p.grafana, f"http://127.0.0.1:{p.prometheus}",
                                                 f"http://127.0.0.1:{p.alertmanager}")
        specs["grafana"] = grafana_cmd + g_argv
        checks["grafana"] = lambda: _ok(f"http://127.0.0.1:{p.grafana}/api/health")
    urls = StackUrls(prometheus=f"http://127.0.0.1:{p.prometheus}", alertmanager=f"http://127.0.0.1:{p.alertmanager}",
                     pager=pager_url, grafana=f"http://127.0.0.1:{p.grafana}" if grafana_cmd else None,
                     nodes=[f"http://127.0.0.1:{port}/metrics" for port in node_ports],
                     engines=[f"http://127.0.0.1:{port}/metrics" for port in engine_ports], logwatch=lw_urls,
                     remediate=remediate_url if remediate else None)
    state = StackState(run_dir=str(run), started_at=time.time(), ports=asdict(p), nodes=cfg.nodes, gpus=cfg.gpus,
                       seed=cfg.seed, training_nodes=cfg.training_nodes, profile=cfg.profile,
                       exporter_profile=cfg.exporter_profile, host_label_mode=cfg.host_label_mode,
                       scrape_mode=cfg.scrape_mode,
                       hostnames=[h for h, _ in nodes], token_file=str(run / "admin-token"), urls=urls,
                       logwatch=cfg.logwatch, runbook_base=fleet.runbook_base, gpu_models=host_models(cfg),
                       drivers_file=str(Path(cfg.drivers_file).resolve()) if cfg.drivers_file is not None else "")
    deadline = time.monotonic() + cfg.timeout_s
    lw_own = {f"logwatch-{i}": u for i, u in enumerate(lw_urls)}
    drop_notification_log(run / "alertmanager" / "data", out)
    try:
        start_components(state, specs, checks, deadline, out, envs, lw_own)
        _wait("Prometheus to report every node target up",
              lambda: _all_targets_up(state.urls.prometheus, cfg.nodes * (2 if cfg.logwatch else 1) + serving,
                                      scrape_pools(cfg.scrape_mode) + (("logwatch",) if cfg.logwatch else ())),
              deadline)
    except BaseException:
        down(cfg.run_dir, out=out)
        raise
    return state


def drop_notification_log(storage: Path, out=sys.stdout) -> bool:
    """Remove the notification log (``<storage>/nflog``) a previous run of the stack's Alertmanager left
    in ``storage``, keeping its silences; returns whether there was one.

    Why (issue 32, "a recurrence always pages"): Alertmanager v0.25.0 ``notify/notify.go``
    ``DedupStage.needsUpdate`` sends a group's notification only when its firing set is not a subset of
    the last one logged for that group, its resolved set grew, or ``repeat_interval`` (4h) passed. A
    stack brought down while a page was open never sent that page's resolution, so after ``up`` on
    the same run directory the same alert firing again (same labels, same fingerprint) was a subset
    of the logged firing notification and was swallowed for up to 4 hours (reproduced with
    Alertmanager 0.25: delivered only when the log is removed). The pager keys incidents on the group
    and ignores a repeated notification of an open one, so starting without the log can re-notify
    an ongoing incident but never pages it twice. Raises OSError when the file cannot be removed."""
    nflog = storage / "nflog"
    if not nflog.exists():
        return False
    nflog.unlink()
    print(f"alertmanager: removed the previous run's notification log ({nflog}): a page left open by "
          "`down` must not swallow the same alert's next page", file=out, flush=True)
    return True


def _logwatch_specs(cfg: StackConfig, run: Path, nodes: list[tuple[str, int]]):
    """argv, health checks and /metrics URLs of one ``gpuobs logwatch`` per node.

    Each follows its node's ``/admin/kernel-log`` (state under ``run/logwatch/``) and maps bus ids with
    a ``--gpu-map`` file in nvidia-smi's ``index, pci.bus_id, uuid`` form, written here from the
    simulated identities (what ``nvidia-smi --query-gpu`` prints on a real node without NVML access).
    Ports: ``ports.logwatch_base + i``, or free loopback ports chosen now when it is 0. Prometheus
    scrapes them as job ``logwatch`` (file_sd, label ``node``).
    """
    from gpuobs.exporter.sim.gpu import H100_SXM
    from gpuobs.exporter.sim.identity import gpu_identity
    from gpuobs.stack.ports import free_port_range

    base = cfg.ports.logwatch_base or free_port_range(len(nodes), start=20000)
    lw_ports = [base + i for i in range(len(nodes))]
    busy = [str(x) for x in lw_ports if not port_free(x)]
    if busy:
        raise StackError(f"logwatch ports already in use on 127.0.0.1: {', '.join(busy)}", 2)
    py = [sys.executable, "-m", "gpuobs"]
    specs, checks, urls = {}, {}, []
    for i, ((host, node_port), port) in enumerate(zip(nodes, lw_ports)):
        gmap = run / "logwatch" / f"{host}-gpus.csv"
        rows = [gpu_identity(cfg.seed, i, g, H100_SXM.name) for g in range(cfg.gpus)]
        atomic_write(gmap, "index, pci.bus_id, uuid\n" + "".join(f"{r.index}, {r.pci_bus_id}, {r.uuid}\n" for r in rows))
        specs[f"logwatch-{i}"] = py + ["logwatch", "--source", "sim", "--url", f"http://127.0.0.1:{node_port}",
                                       "--token-file", str(run / "admin-token"), "--state-file",
                                       str(run / "logwatch" / f"{host}.state.json"), "--port", str(port),
                                       "--hostname", host, "--gpu-map", str(gmap), "--no-nvml", "--interval", "0.5"]
        checks[f"logwatch-{i}"] = (lambda u: lambda: _ok(u))(f"http://127.0.0.1:{port}/health")
        urls.append(f"http://127.0.0.1:{port}/metrics")
    write_targets(run, "logwatch", [(h, port, {}) for (h, _), port in zip(nodes, lw_ports)])
    return specs, checks, urls


def _spawn(argv: list[str], log: Path, env: dict, cwd: Path) -> subprocess.Popen:
    """Start one component in a session of its own, output appended to ``log``, umask 077."""
    with open(log, "ab") as fh:
        return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=cwd, umask=UMASK)


def component_ports(state: StackState, name: str) -> list[int]:
    """The TCP ports component ``name`` listens on, from the recorded ports and fleet shape."""
    p = state.ports
    if name == "exporter":
        serving = state.nodes - state.training_nodes
        return ([p["node_base"] + i for i in range(state.nodes)] + [p["engine_base"] + i for i in range(serving)]
                if "node_base" in p and "engine_base" in p else [])
    return [p[name]] if name in p else []


def _listening_inodes(ports: set[int]) -> set[str]:
    """Socket inodes of TCP sockets in LISTEN state on any of ``ports`` (IPv4 and IPv6)."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) in ports:
                found.add(f[9])
    return found


def _pids_owning(inodes: set[str]) -> set[int]:
    """Pids with an open file descriptor on one of the socket ``inodes`` (our own user's processes)."""
    pids: set[int] = set()
    if not inodes:
        return pids
    wanted = {f"socket:[{i}]" for i in inodes}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    pids.add(int(d.name))
                    break
        except OSError:
            continue
    return pids


def _same_program(cmd: list[str], argv: list[str]) -> bool:
    """Whether ``cmd`` runs the program of ``argv``: the same executable and, for ``python -m gpuobs
    GROUP``, the same group (so a port holder of another kind is never taken for a component)."""
    if not cmd or not argv:
        return False
    if argv[1:3] == ["-m", "gpuobs"]:
        return len(cmd) > 3 and cmd[1:4] == argv[1:4] and os.path.basename(cmd[0]).startswith("python")
    return os.path.basename(cmd[0]) == os.path.basename(argv[0])


def find_processes(state: StackState, name: str) -> list[int]:
    """Pids of component ``name`` now: its recorded pid if it still runs the recorded argv, any other
    process running exactly that argv, and any process listening on the component's ports that runs
    the same program. Sorted; empty when the component is down."""
    comp = state.components.get(name)
    if comp is None:
        return []
    pids = {comp.pid} if alive(comp.pid, comp.argv) else set()
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) not in (me, 1) and _cmdline(int(d.name)) == comp.argv:
            pids.add(int(d.name))
    for pid in _pids_owning(_listening_inodes(set(component_ports(state, name)))):
        if pid not in (me, 1) and _same_program(_cmdline(pid), comp.argv):
            pids.add(pid)
    return sorted(pids)


def _stop_pids(pids: list[int], grace_s: float) -> list[int]:
    """SIGTERM ``pids`` (their process group when they lead one), wait up to ``grace_s``, then
    SIGKILL what is left; returns the pids that were signalled."""
    cmds = {pid: _cmdline(pid) for pid in pids}
    sent = []
    for pid in pids:
        try:
            kill = os.killpg if os.getpgid(pid) == pid else os.kill
            kill(pid, signal.SIGTERM)
            sent.append(pid)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + grace_s

    def running(pid: int) -> bool:
        _reap(pid)
        return bool(cmds[pid]) and _cmdline(pid) == cmds[pid]

    while any(running(pid) for pid in sent) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in sent:
        if running(pid):
            try:
                kill = os.killpg if os.getpgid(pid) == pid else os.kill
                kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(pid)
    kill_deadline = time.monotonic() + 5.0
    while any(running(pid) for pid in sent) and time.monotonic() < kill_deadline:
        time.sleep(0.05)
    return sent


def down(run_dir: Path, out=sys.stdout, grace_s: float = 10.0) -> int:
    """Stop every process of the stack recorded in ``run_dir``'s stack.json (reverse start order;
    found by argv and ports, see :func:`find_processes`); returns how many were stopped.
    Raises StackError (exit 2) if stack.json is damaged."""
    state = load_state(run_dir.resolve())
    if not state:
        print(f"no stack recorded in {run_dir}", file=out)
        return 0
    stopped = 0
    for name in reversed(list(state.components)):
        for pid in _stop_pids(find_processes(state, name), grace_s):
            stopped += 1
            print(f"stopped {name:<12} pid {pid}", file=out)
    state.components = {}
    with private_files():
        state_file.save(state)
    return stopped


def restart(run_dir: Path, name: str, out=sys.stdout, grace_s: float = 10.0, timeout_s: float = 60.0) -> int:
    """Stop component ``name`` (every process of it, :func:`find_processes`) and start it again with its
    recorded argv, log and environment; waits until it is healthy and returns the new pid.

    Raises StackError: exit 2 when no stack is recorded or ``name`` is not one of its components;
    exit 1 when it does not come back healthy within ``timeout_s`` (its log tail is in the message).
    """
    run = run_dir.resolve()
    state = load_state(run)
    if not state or not state.components:
        raise StackError(f"no stack running from {run_dir}; start one with `gpuobs stack up`", 2)
    if name not in state.components:
        raise StackError(f"unknown component {name!r}; this stack has: {', '.join(state.components)}", 2)
    comp = state.components[name]
    for pid in _stop_pids(find_processes(state, name), grace_s):
        print(f"stopped {name:<12} pid {pid}", file=out)
    # A stopped process's listening socket can outlive it briefly (exit still in progress on a busy
    # machine); poll for the ports with a deadline rather than judge at once.
    port_deadline = time.time() + 5.0
    while True:
        busy = [str(x) for x in component_ports(state, name) if not port_free(x)]
        if not busy or time.time() >= port_deadline:
            break
        time.sleep(0.1)
    if busy:
        raise StackError(f"{name}: ports still in use after stopping it: {', '.join(busy)}")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if name == "grafana":
        _, env = render_grafana(run, state.ports["grafana"], state.urls.prometheus, state.urls.alertmanager)
    log = Path(comp.log) if comp.log else run / "logs" / f"{name}.log"
    with private_files():
        proc = _spawn(comp.argv, log, env, run)
        comp.pid = proc.pid
        state_file.save(state)
    print(f"started {name:<12} pid {proc.pid}", file=out, flush=True)
    urls = health_urls(state, name, ready=True)
    _wait(name, lambda: all(_ok(u) for u in urls), time.monotonic() + timeout_s, proc, log)
    return proc.pid


#: Health path of each kind of HA member (gpuobs.stack.ha), by component-name prefix.
MEMBER_HEALTH = {"prometheus-": ("/-/healthy", "/-/ready"), "alertmanager-": ("/-/healthy", "/-/ready"),
                 "victoria-metrics": ("/health", "/health"), "vmalert": ("/health", "/health")}


def health_urls(state: StackState, name: str, ready: bool = False) -> list[str]:
    """The URLs that answer 200 when component ``name`` is healthy (``ready``: ready to serve, for
    Prometheus and Alertmanager ``/-/ready``). Raises KeyError for a name the stack does not know."""
    u = state.urls
    comp = state.components.get(name)
    if name.startswith("logwatch-") and comp is not None:
        return [comp.url.replace("/metrics", "/health")]
    if name in state.members:
        path = next(paths for prefix, paths in MEMBER_HEALTH.items() if name.startswith(prefix))
        return [state.members[name] + path[1 if ready else 0]]
    return {"exporter": [n.replace("/metrics", "/health") for n in (u.nodes + u.engines if ready else u.nodes)],
            "pager": [f"{u.pager}/health"],
            "remediate": [f"{u.remediate}/health"],
            "alertmanager": [f"{u.alertmanager}/-/{'ready' if ready else 'healthy'}"],
            "prometheus": [f"{u.prometheus}/-/{'ready' if ready else 'healthy'}"],
            "grafana": [f"{u.grafana}/api/health"]}[name]


def _reap(pid: int) -> None:
    """Collect a child's exit status if it is ours (in-process callers such as tests)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def status(run_dir: Path) -> list[dict]:
    """Health of each recorded component: name, pid, running, healthy, url."""
    state = load_state(run_dir.resolve())
    if not state:
        return []
    u = state.urls
    shown = {"exporter": u.node_bases[0] if u.node_bases else "", "pager": u.pager, "remediate": u.remediate or "",
             "alertmanager": u.alertmanager, "prometheus": u.prometheus, "grafana": u.grafana, **state.members}
    rows = []
    for name, comp in state.components.items():
        pids = find_processes(state, name)
        running = bool(pids)
        pid = comp.pid if comp.pid in pids or not pids else pids[0]
        healthy = False
        if name.startswith("logwatch-"):
            shown[name] = comp.url.removesuffix("/metrics")
        if running:
            try:
                healthy = all(_ok(url) for url in health_urls(state, name))
            except requests.RequestException:
                healthy = False
        rows.append({"component": name, "pid": pid, "running": running, "healthy": healthy,
                     "url": shown[name], "recorded_pid": comp.pid, "pids": pids})
    return rows
