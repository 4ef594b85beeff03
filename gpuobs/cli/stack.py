"""``gpuobs stack``: the native stack's supervisor (up, down, status, restart COMPONENT)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuobs.cli.common import (
    add_fleet_hardware_flags,
    PORT,
    HelpFormatter,
    env,
    fail,
    finite,
    int_range,
    pos_float,
    run_dir_default,
)


def cmd_stack(args: argparse.Namespace) -> int:
    from gpuobs.stack import supervisor as sv

    try:
        return _stack(args)
    except sv.StackError as exc:
        return fail(str(exc), exc.exit_code)


def _stack(args: argparse.Namespace) -> int:
    from gpuobs.stack import supervisor as sv
    from gpuobs.stack.render import Ports

    run = Path(args.run_dir)
    if args.action != "restart" and args.component:
        return fail(f"unexpected argument {args.component!r}: only `stack restart COMPONENT` takes a component")
    if args.action in ("down", "status", "restart"):
        sv.check_run_dir(run)
    if args.action == "restart":
        if not args.component:
            return fail("stack restart needs a COMPONENT: exporter, pager, alertmanager, prometheus or grafana "
                        "(HA topology: prometheus-s<i>-r<j>, alertmanager-<i>, victoria-metrics, vmalert)")
        pid = sv.restart(run, args.component, timeout_s=args.timeout)
        print(f"{args.component} restarted (pid {pid})")
        return 0
    if args.action == "down":
        n = sv.down(run)
        print(f"stack down ({n} process{'es' if n != 1 else ''} stopped)")
        return 0
    if args.action == "status":
        rows = sv.status(run)
        if not rows:
            print(f"no stack running from {run}")
            return 1
        for r in rows:
            state = "healthy" if r["healthy"] else ("running, unhealthy" if r["running"] else "stopped")
            note = "" if r["pid"] == r["recorded_pid"] or not r["running"] else f"  (restarted by hand; recorded pid {r['recorded_pid']})"
            print(f"{r['component']:<17} pid {r['pid']:<8} {state:<19} {r['url']}{note}")
        from gpuobs.stack import ha

        cluster = ha.cluster_status(run)
        for c in cluster:
            seen = "unreachable" if c["peers"] is None else f"{c['peers']} of {len(cluster)} peers, cluster {c['cluster']}"
            print(f"{c['component']:<17} {seen}")
        whole = all(c["peers"] == len(cluster) for c in cluster)
        return 0 if all(r["healthy"] for r in rows) and whole else 1
    ports = Ports(prometheus=args.prometheus_port, alertmanager=args.alertmanager_port, pager=args.pager_port,
                  node_base=args.base_port, engine_base=args.engine_base_port, grafana=args.grafana_port,
                  remediate=args.remediate_port)
    if args.training_nodes >= args.nodes:
        return fail(f"--training-nodes {args.training_nodes} must leave at least one serving node (--nodes {args.nodes})")
    cfg = sv.StackConfig(run_dir=run, nodes=args.nodes, gpus=args.gpus, seed=args.seed, ports=ports,
                         training_nodes=args.training_nodes, profile=args.profile, rate_rps=args.rate,
                         xid_window_ms=args.xid_window_ms, runbook_base=args.runbook_base, timeout_s=args.timeout,
                         exporter_profile=args.exporter_profile, host_label_mode=args.host_label_mode,
                         scrape_mode=args.scrape_mode, collect_interval_s=args.collect_interval,
                         clock_events_name=args.clock_events_name,
                         remediate=args.remediate if args.topology != "ha" else "off", stop_hint=args.stop_hint,
                         gpu_models=args.gpu_models or "", drivers_file=Path(args.drivers) if args.drivers else None)
    if args.check:  # `make up` asks this before it says which mode it starts: the refusal comes first
        sv.check_config(cfg)
        print(f"no stack runs from {run}; the configuration is valid")
        return 0
    if args.topology == "ha":
        return _up_ha(args, cfg)
    try:
        state = sv.up(cfg)
    except sv.StackError as exc:
        return fail(str(exc), exc.exit_code)
    u = state.urls
    print("gpuobs stack is up (native mode):")
    from gpuobs.stack.ui import prometheus_pages

    pages = prometheus_pages(u.prometheus)
    print(f"  Prometheus    {u.prometheus}" + (f"  ({', '.join(pages.get(k, '') for k in ('alerts', 'targets', 'graph') if k in pages)})"
                                               if pages else ""))
    print(f"  Alertmanager  {u.alertmanager}  (no web UI in Debian's build: use amtool or the API)")
    print(f"  Pager         {u.pager}  (incident console; /api/incidents, /api/pages, /runbooks/)")
    if u.remediate:
        print(f"  Remediation   {u.remediate}  (mode {cfg.remediate}; /api/status, /metrics; `gpuobs remediate status`)")
    if u.grafana:
        print(f"  Grafana       {u.grafana}  (anonymous viewer; admin password in run dir grafana/admin-password)")
    else:
        print("  Grafana       not started: no `grafana`/`grafana-server` binary on PATH "
              "(dashboards: grafana/dashboards/*.json; compose mode runs Grafana)")
    models = ", ".join(f"{len(hosts)} {name}" for name, hosts in state.hosts_by_model().items())
    print(f"  GPU nodes     {u.nodes[0]} .. {u.nodes[-1]}  ({state.nodes} nodes x {state.gpus} GPUs, "
          f"{state.training_nodes} training; {models})")
    print(f"  vLLM engines  {u.engines[0]} .. {u.engines[-1]}")
    print(f"  run dir       {state.run_dir}  (logs/, stack.json, admin-token); rule profile {state.profile}")
    print(f"  exporters     profile {state.exporter_profile}, host label {state.host_label_mode}, "
          f"scrape mode {state.scrape_mode}")
    print(next_steps(str(state.run_dir)))
    return 0


def next_steps(run_dir: str, drill: bool = True) -> str:
    """What to try and how to stop, for the stack in ``run_dir``: the make targets for the Makefile's
    own run directory (``.run``), the CLI with ``--run-dir`` for any other (make would act on ``.run``)."""
    from pathlib import Path

    if Path(run_dir).resolve() == Path(".run").resolve():
        return ("Try: make drill-xid    " if drill else "Status: make status    ") + "Stop: make down"
    return ((f"Try: gpuobs drill xid --run-dir {run_dir}    " if drill else
             f"Status: gpuobs stack status --run-dir {run_dir}    ") + f"Stop: gpuobs stack down --run-dir {run_dir}")


def _up_ha(args: argparse.Namespace, cfg) -> int:
    from gpuobs.stack import ha
    from gpuobs.stack import supervisor as sv

    hcfg = ha.HAConfig(stack=cfg, shards=args.shards, replicas=args.replicas, alertmanagers=args.alertmanagers,
                       base_port=args.ha_base_port, scrape_interval_s=args.scrape_interval)
    try:
        state = ha.up(hcfg)
    except sv.StackError as exc:
        return fail(str(exc), exc.exit_code)
    u = state.urls
    print(f"gpuobs stack is up (native mode, HA topology: {args.shards} shards x {args.replicas} replicas, "
          f"{args.alertmanagers} Alertmanagers):")
    for name, url in state.members.items():
        role = ("Prometheus" if name.startswith("prometheus-") else "Alertmanager" if name.startswith("alertmanager-")
                else "VictoriaMetrics (global Prometheus API)" if name == "victoria-metrics" else "vmalert (fleet-wide rules)")
        print(f"  {name:<17} {url}  {role}")
    print(f"  Pager             {u.pager}  (incident console)")
    print(f"  GPU nodes         {u.nodes[0]} .. {u.nodes[-1]}  ({state.nodes} nodes x {state.gpus} GPUs)")
    print(f"  run dir           {state.run_dir}  (placement.json: which rule runs where); rule profile {state.profile}")
    print(f"Global queries: {u.prometheus}/api/v1/query    {next_steps(str(state.run_dir), drill=False)}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``stack`` group to ``sub``."""
    s = sub.add_parser("stack", help="run the native stack: up | down | status | restart COMPONENT",
                       formatter_class=HelpFormatter)
    s.add_argument("action", choices=["up", "down", "status", "restart"],
                   help="up: start the stack; down: stop it; status: each component's health; restart: stop and "
                        "start one COMPONENT")
    s.add_argument("component", nargs="?",
                   help="the component `restart` stops and starts again with its recorded command line: exporter, "
                        "pager, alertmanager, prometheus, grafana; HA: prometheus-s<i>-r<j>, alertmanager-<i>, "
                        "victoria-metrics, vmalert")
    s.add_argument("--run-dir", default=run_dir_default(), help="state, configs, logs (env GPUOBS_RUN_DIR)")
    s.add_argument("--nodes", type=int_range(1, 256), default=env("NODES", "4"),
                   help="simulated nodes, 1..256 (env GPUOBS_NODES)")
    s.add_argument("--gpus", type=int_range(1, 16), default=env("GPUS", "8"), help="GPUs per node, 1..16 (env GPUOBS_GPUS)")
    s.add_argument("--seed", type=int, default=1, help="RNG seed of the fleet")
    s.add_argument("--prometheus-port", type=PORT, default=env("PROMETHEUS_PORT", "9090"),
                   help="Prometheus port (env GPUOBS_PROMETHEUS_PORT)")
    s.add_argument("--alertmanager-port", type=PORT, default=env("ALERTMANAGER_PORT", "9093"),
                   help="Alertmanager port (env GPUOBS_ALERTMANAGER_PORT)")
    s.add_argument("--pager-port", type=PORT, default=env("PAGER_PORT", "9097"), help="pager port (env GPUOBS_PAGER_PORT)")
    s.add_argument("--remediate-port", type=PORT, default=env("REMEDIATE_PORT", "9098"),
                   help="remediation controller port (env GPUOBS_REMEDIATE_PORT)")
    s.add_argument("--remediate", default=env("REMEDIATE", "dry-run"),
                   help="the remediation controller's mode: enforce (quarantine, drain, reset or reboot, return), "
                        "dry-run (record what it would do), observe (record events), off (not started); "
                        "single topology only; env GPUOBS_REMEDIATE (docs/remediation.md)")
    s.add_argument("--base-port", type=PORT, default=env("BASE_PORT", "9400"), help="first node port (env GPUOBS_BASE_PORT)")
    s.add_argument("--rate", type=pos_float, default=env("RATE", "4"),
                   help="mean request rate per serving node, req/s (env GPUOBS_RATE; the simulated engine's KV cache "
                        "saturates above ~7 req/s, which then queues and slows TTFT like a real overloaded engine)")
    s.add_argument("--grafana-port", type=PORT, default=env("GRAFANA_PORT", "3000"),
                   help="Grafana, started only if a grafana binary is on PATH (env GPUOBS_GRAFANA_PORT)")
    s.add_argument("--engine-base-port", type=PORT, default=env("ENGINE_BASE_PORT", "8000"),
                   help="first serving-engine port (env GPUOBS_ENGINE_BASE_PORT)")
    s.add_argument("--training-nodes", type=int_range(0, 255), default=env("TRAINING_NODES", "1"),
                   help="the last N nodes run training instead of serving (env GPUOBS_TRAINING_NODES)")
    add_fleet_hardware_flags(s, "recorded per host in stack.json (gpu_models); ")
    s.add_argument("--xid-window-ms", type=int_range(1000, 86_400_000), default=15_000,
                   help="exporter Xid window for the local stack, short so drills resolve in ~1.5 min")
    s.add_argument("--runbook-base", default=env("RUNBOOK_BASE"),
                   help="runbook_url base (env GPUOBS_RUNBOOK_BASE; default: the pager)")
    s.add_argument("--profile", choices=["default", "drill"], default=env("PROFILE", "default"),
                   help="rule profile. default: the rule files as they are; drill: `for:` capped at 20s and a 1d SLO "
                        "period so every drill fires and resolves in minutes (see gpuobs/mixin/profile.py); "
                        "env GPUOBS_PROFILE")
    s.add_argument("--exporter-profile", default=env("EXPORTER_PROFILE", "stock"),
                   help="what the simulated DCGM pages serve: stock (dcgm-exporter 4.x counters), helm "
                        "(the Helm chart's ConfigMap), recommended (deploy/dcgm-exporter/recommended.csv + gpuobs "
                        "extras); env GPUOBS_EXPORTER_PROFILE")
    s.add_argument("--host-label-mode", default=env("HOST_LABEL_MODE", "Hostname"),
                   help="the DCGM pages' host label: Hostname, hostname, localhost, pod, none; env GPUOBS_HOST_LABEL_MODE")
    s.add_argument("--scrape-mode", default=env("SCRAPE_MODE", "file_sd"),
                   help="file_sd: targets labelled node, jobs dcgm/vllm; servicemonitor: kube-prometheus "
                        "ServiceMonitor target labels (job = Service name, namespace, pod, service, endpoint, "
                        "instance) plus node, page pod labels stored as exported_*; env GPUOBS_SCRAPE_MODE")
    s.add_argument("--collect-interval", type=finite(float), default=0.0, metavar="SECONDS",
                   help="DCGM field update interval (DCGM's own is 30): values repeat across scrapes; 0 = fresh")
    s.add_argument("--clock-events-name", default="canonical", choices=["canonical", "legacy"],
                   help="field 112's name on the pages: DCGM_FI_DEV_CLOCKS_EVENT_REASONS (canonical) or "
                        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (legacy counters files)")
    s.add_argument("--timeout", type=pos_float, default=90.0, help="start-up (or restart) deadline, seconds")
    s.add_argument("--check", action="store_true",
                   help="up: check the values and that no stack runs from --run-dir (exit 2 with the reason if one "
                        "does), then exit without starting or writing anything")
    s.add_argument("--stop-hint", default="", metavar="COMMAND",
                   help="up: the command the refusal to start over a running stack tells to run first (default: "
                        "gpuobs stack down --run-dir DIR; `make up` passes `make down`)")
    s.add_argument("--topology", choices=["single", "ha"], default=env("TOPOLOGY", "single"),
                   help="single: one Prometheus and one Alertmanager; ha: Prometheus shards x replicas, an "
                        "Alertmanager cluster, VictoriaMetrics and vmalert (docs/ha.md); env GPUOBS_TOPOLOGY")
    ha = s.add_argument_group("HA topology (--topology ha)")
    ha.add_argument("--shards", type=int_range(1, 16), default=2, help="Prometheus shards (hashmod of the node)")
    ha.add_argument("--replicas", type=int_range(1, 4), default=2, help="Prometheus replicas per shard")
    ha.add_argument("--alertmanagers", type=int_range(1, 7), default=3, help="Alertmanager cluster members")
    ha.add_argument("--ha-base-port", type=int_range(0, 65535), default=env("HA_BASE_PORT", "0"),
                    help="first of the members' ports (Prometheus replicas, Alertmanager web and gossip, "
                         "VictoriaMetrics, vmalert, in that order); 0 = a free block; env GPUOBS_HA_BASE_PORT")
    ha.add_argument("--scrape-interval", type=int_range(1, 300), default=5,
                    help="scrape and evaluation interval in seconds (also VictoriaMetrics's dedup interval)")
    s.set_defaults(func=cmd_stack)
