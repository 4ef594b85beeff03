"""The ``gpuobs`` command: exporter, pager, fault, stack, drill, rules, compat.

Exit codes (design §8): 0 success, 1 failure (drill missed, incompatible, stack failed to start),
2 usage or input error, 3 inconclusive. Flags fall back to ``GPUOBS_*`` environment variables where
noted in their help.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gpuobs import __version__, log


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"GPUOBS_{name}", default)


def _int_range(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer {lo}..{hi}, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer {lo}..{hi}, got {value}")
        return value
    return parse


def _pos_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _finite(kind: type):
    """argparse type for fault parameters: int, str, or a finite float (no nan/inf)."""
    if kind is not float:
        return kind

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        return value
    return parse


PORT = _int_range(1, 65535)
LOG_LEVELS = ["debug", "info", "warning", "error"]


def _fail(msg: str, code: int = 2) -> int:
    print(f"gpuobs: error: {msg}", file=sys.stderr)
    return code


# ---- exporter ----------------------------------------------------------------------------------
def cmd_exporter(args: argparse.Namespace) -> int:
    from gpuobs.exporter.fleet import Fleet, FleetConfig, load_k8s_map, load_or_create_token
    from gpuobs.exporter.mig import parse_mig_spec
    from gpuobs.exporter.releases import CatalogueError

    if args.source == "nvml":
        from gpuobs.exporter.nvml_serve import main_nvml

        return main_nvml(args.host, args.base_port, args.hostname_label)
    for flag, base in (("--base-port", args.base_port), ("--engine-base-port", args.engine_base_port)):
        if base + args.nodes - 1 > 65535:
            return _fail(f"{flag} {base} + --nodes {args.nodes} runs past port 65535")
    if args.training_nodes > args.nodes:
        return _fail(f"--training-nodes {args.training_nodes} exceeds --nodes {args.nodes}")
    try:
        mig = parse_mig_spec(args.mig_profile, args.gpus) if args.mig_profile else None
        k8s = load_k8s_map(Path(args.k8s_map)) if args.k8s_map else None
    except (OSError, ValueError) as exc:
        return _fail(str(exc))
    try:
        from gpuobs.exporter.releases import load as load_releases

        load_releases(Path(args.releases) if args.releases else None)
    except CatalogueError as exc:
        return _fail(f"--releases: {exc}")
    try:
        token = load_or_create_token(args.token, Path(args.token_file))
    except (OSError, ValueError) as exc:
        return _fail(f"admin token: {exc}")
    cfg = FleetConfig(nodes=args.nodes, gpus=args.gpus, base_port=args.base_port, seed=args.seed, host=args.host,
                      driver_version=args.driver_version, hostname_label=args.hostname_label,
                      xid_window_ms=args.xid_window_ms, tick_s=args.tick_s, engine_base_port=args.engine_base_port,
                      training_nodes=args.training_nodes, node_offset=args.node_offset, rate_rps=args.rate,
                      mig=mig, k8s=k8s, releases_file=Path(args.releases) if args.releases else None)
    try:
        fleet = Fleet(cfg, token)
    except (CatalogueError, KeyError) as exc:
        return _fail(f"--releases: {exc}")
    except OSError as exc:
        return _fail(f"cannot listen on {args.host}:{args.base_port}..{args.base_port + args.nodes - 1}: {exc}")
    fleet.run_forever()
    return 0


def cmd_pager(args: argparse.Namespace) -> int:
    from gpuobs.stack.pager import serve

    import sqlite3

    if args.runbooks_dir and not Path(args.runbooks_dir).is_dir():
        return _fail(f"--runbooks-dir {args.runbooks_dir} is not a directory")
    try:
        serve(args.host, args.port, Path(args.db), Path(args.runbooks_dir) if args.runbooks_dir else None)
    except sqlite3.Error as exc:
        return _fail(f"--db {args.db}: not a usable SQLite database ({exc})")
    except OSError as exc:
        return _fail(f"pager cannot start on {args.host}:{args.port} with --db {args.db}: {exc}")
    return 0


# ---- fault -------------------------------------------------------------------------------------
def _node_urls(args: argparse.Namespace) -> tuple[list[str], str]:
    """Node base URLs and admin token, from --url/--token or the run directory's stack.json."""
    from gpuobs.stack.supervisor import load_state

    token = args.token or _env("ADMIN_TOKEN")
    if args.url:
        if not args.url.startswith(("http://", "https://")):
            raise ValueError(f"--url must be an http(s) URL like http://127.0.0.1:9400; got {args.url!r}")
        if not token:
            token_file = Path(args.run_dir) / "admin-token"
            if not token_file.exists():
                raise ValueError("--url needs --token (or GPUOBS_ADMIN_TOKEN)")
            token = token_file.read_text().strip()
        return [args.url.rstrip("/")], token
    state = load_state(Path(args.run_dir))
    if not state or not state["components"]:
        raise ValueError(f"no running stack in {args.run_dir}; start one with `make up` or pass --url/--token")
    urls = [u.removesuffix("/metrics") for u in state["urls"]["nodes"]]
    return urls, token or Path(state["token_file"]).read_text().strip()


def _describe(fault: dict) -> str:
    """One fault as text: ``xid on gpu 3: code=48, repeat_s=0``."""
    where = f"on gpu {fault['gpu']}" if fault.get("gpu") is not None else "node-wide"
    params = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in fault["params"].items())
    return f"{fault['kind']} {where}" + (f": {params}" if params else "")


def cmd_fault(args: argparse.Namespace) -> int:
    from gpuobs.exporter.admin_client import AdminClient, AdminError

    try:
        urls, token = _node_urls(args)
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    if args.url:
        selected = [0]
    elif args.node is None:
        if args.action == "inject" or (args.action == "clear" and not args.all):
            return _fail(f"--node is required (0..{len(urls) - 1})")
        selected = list(range(len(urls)))  # list, clear --all: every node
    elif not 0 <= args.node < len(urls):
        return _fail(f"--node must be 0..{len(urls) - 1}, got {args.node}")
    else:
        selected = [args.node]
    try:
        if args.action == "list":
            rows = [{"node": n, "url": urls[n], "faults": AdminClient(urls[n], token).list()} for n in selected]
            if args.json:
                print(json.dumps(rows, indent=2))
            elif not any(r["faults"] for r in rows):
                print("no active faults")
            else:
                for r in rows:
                    for f in r["faults"]:
                        print(f"node {r['node']}  {f['id']:<6} {_describe(f)}")
            return 0
        if args.action == "inject":
            body = {"kind": args.kind}
            if args.gpu is not None:
                body["gpu"] = args.gpu
            for key, value in (args.params or {}).items():
                if value is not None:
                    body[key] = value
            fault = AdminClient(urls[selected[0]], token).inject(body)
            print(json.dumps(fault) if args.json else f"injected {fault['id']}: {_describe(fault)}")
        else:
            for n in selected:
                client = AdminClient(urls[n], token)
                ids = [f["id"] for f in client.list()] if args.all else args.ids
                if not ids and not args.all:
                    return _fail("give fault ids to clear, or --all")
                for fid in ids:
                    client.clear(fid)
                    print(f"cleared {fid}" + (f" on node {n}" if len(selected) > 1 else ""))
        return 0
    except AdminError as exc:
        return _fail(f"{exc}" + (f" (field: {exc.field})" if exc.field else ""), 2 if exc.status in (400, 401, 404, 413) else 1)


# ---- stack / drill / rules -------------------------------------------------------------------------
def cmd_stack(args: argparse.Namespace) -> int:
    from gpuobs.stack import supervisor as sv

    try:
        return _stack(args)
    except sv.StackError as exc:
        return _fail(str(exc), exc.exit_code)


def _stack(args: argparse.Namespace) -> int:
    from gpuobs.stack import supervisor as sv
    from gpuobs.stack.render import Ports

    run = Path(args.run_dir)
    if args.action in ("down", "status"):
        sv.check_run_dir(run)
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
            print(f"{r['component']:<13} pid {r['pid']:<8} {state:<19} {r['url']}")
        return 0 if all(r["healthy"] for r in rows) else 1
    ports = Ports(prometheus=args.prometheus_port, alertmanager=args.alertmanager_port, pager=args.pager_port,
                  node_base=args.base_port, engine_base=args.engine_base_port, grafana=args.grafana_port)
    if args.training_nodes >= args.nodes:
        return _fail(f"--training-nodes {args.training_nodes} must leave at least one serving node (--nodes {args.nodes})")
    cfg = sv.StackConfig(run_dir=run, nodes=args.nodes, gpus=args.gpus, seed=args.seed, ports=ports,
                         training_nodes=args.training_nodes, profile=args.profile, rate_rps=args.rate,
                         xid_window_ms=args.xid_window_ms, runbook_base=args.runbook_base, timeout_s=args.timeout)
    try:
        state = sv.up(cfg)
    except sv.StackError as exc:
        return _fail(str(exc), exc.exit_code)
    u = state["urls"]
    print("gpuobs stack is up (native mode):")
    print(f"  Prometheus    {u['prometheus']}")
    print(f"  Alertmanager  {u['alertmanager']}  (no web UI in Debian's build: use amtool or the API)")
    print(f"  Pager         {u['pager']}  (/api/pages, /runbooks/)")
    if u.get("grafana"):
        print(f"  Grafana       {u['grafana']}  (anonymous viewer; admin password in run dir grafana/admin-password)")
    else:
        print("  Grafana       not started: no `grafana`/`grafana-server` binary on PATH "
              "(dashboards: grafana/dashboards/*.json; compose mode runs Grafana)")
    print(f"  GPU nodes     {u['nodes'][0]} .. {u['nodes'][-1]}  ({state['nodes']} nodes x {state['gpus']} GPUs, "
          f"{state['training_nodes']} training)")
    print(f"  vLLM engines  {u['engines'][0]} .. {u['engines'][-1]}")
    print(f"  run dir       {state['run_dir']}  (logs/, stack.json, admin-token); rule profile {state['profile']}")
    print("Try: make drill-xid    Stop: make down")
    return 0


def cmd_drill(args: argparse.Namespace) -> int:
    from gpuobs.stack import drill
    from gpuobs.stack.drills import xid_drill
    from gpuobs.stack.supervisor import load_state

    state = load_state(Path(args.run_dir))
    if not state or not state["components"]:
        return _fail(f"no running stack in {args.run_dir}; start one with `make up`")
    progress = None if args.json else (lambda m: print(f"  .. {m}", flush=True))
    if args.drill == "soak":
        from gpuobs.stack.soak import run_soak

        res = run_soak(state, args.minutes, progress=progress)
        print(json.dumps(res.to_json(), indent=2) if args.json else res.summary())
        return 0 if res.ok else 1
    try:
        if args.drill == "all":
            results = drill.run_all(state, progress)
        else:
            spec = None
            if args.drill == "xid" and args.code != 48:
                spec = xid_drill(args.code)
            results = [drill.run_drill(state, args.drill, progress=progress, spec=spec)]
    except (drill.DrillError, ValueError) as exc:
        return _fail(str(exc))
    from gpuobs.stack.render import atomic_write

    for r in results:  # kept for `gpuobs report drill <name>`
        atomic_write(Path(state["run_dir"]) / "drills" / f"{r.drill}-{int(r.injected_at)}.json",
                     json.dumps(r.to_json(), indent=2))
    if args.json:
        print(json.dumps([r.to_json() for r in results] if args.drill == "all" else results[0].to_json(), indent=2))
    else:
        for r in results:
            print(drill.format_timeline(r))
        if len(results) > 1:
            print()
            print(drill.format_table(results))
    return 0 if all(r.ok for r in results) else 1


def cmd_rules(args: argparse.Namespace) -> int:
    from gpuobs.rulegen import render_xid_rules
    from gpuobs.slo_rules import SloConfigError, render_slo_rules

    try:
        text = render_xid_rules() if args.which == "xid" else render_slo_rules(Path(args.slo_config), args.period)
    except (SloConfigError, OSError) as exc:
        return _fail(str(exc))
    if args.check:
        try:
            current = Path(args.check).read_text()
        except OSError as exc:
            return _fail(f"--check {args.check}: {exc.strerror}")
        if current != text:
            return _fail(f"{args.check} is out of date; regenerate with `gpuobs rules {args.which} > {args.check}` (or `make rules`)", 1)
        return 0
    sys.stdout.write(text)
    return 0


# ---- parser ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuobs", description="Observability and release safety for GPU platforms.")
    p.add_argument("--version", action="version", version=f"gpuobs {__version__}")
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "info"), choices=LOG_LEVELS)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run_dir = _env("RUN_DIR", ".run")

    e = sub.add_parser("exporter", help="serve simulated GPU nodes (DCGM metrics + fault admin API)")
    e.add_argument("--nodes", type=_int_range(1, 4096), default=4, help="number of nodes (default 4)")
    e.add_argument("--gpus", type=_int_range(1, 16), default=8, help="GPUs per node (default 8)")
    e.add_argument("--base-port", type=PORT, default=9400, help="node i listens on base-port + i (default 9400)")
    e.add_argument("--seed", type=int, default=1, help="RNG seed: same seed, same fleet (default 1)")
    e.add_argument("--host", default=_env("HOST", "127.0.0.1"), help="listen address (default 127.0.0.1)")
    e.add_argument("--token", default=_env("ADMIN_TOKEN"), help="admin bearer token (env GPUOBS_ADMIN_TOKEN)")
    e.add_argument("--token-file", default=str(Path(run_dir) / "admin-token"),
                   help="read the token here, or write a generated one here (default .run/admin-token)")
    e.add_argument("--driver-version", default="550.54.15", help="DCGM_FI_DRIVER_VERSION label (default 550.54.15)")
    e.add_argument("--hostname-label", default="Hostname", choices=["Hostname", "hostname"],
                   help="case of the host label: released dcgm-exporter uses Hostname, newer master hostname")
    e.add_argument("--xid-window-ms", type=_int_range(1000, 86_400_000), default=300_000,
                   help="DCGM_EXP_XID_ERRORS_COUNT window, ms (dcgm-exporter default 300000)")
    e.add_argument("--tick-s", type=_pos_float, default=1.0, help="simulation tick, seconds (default 1)")
    e.add_argument("--source", choices=["sim", "nvml"], default="sim",
                   help="sim: simulated fleet (default); nvml: this machine's real GPUs through NVML")
    e.add_argument("--engine-base-port", type=PORT, default=8000,
                   help="serving node i exposes its vLLM-style engine page on engine-base-port + i (default 8000)")
    e.add_argument("--training-nodes", type=_int_range(0, 4096), default=0,
                   help="the last N nodes run the training role instead of a serving engine")
    e.add_argument("--node-offset", type=_int_range(0, 4095), default=0,
                   help="index of the first node (one process per node in compose: node K uses --node-offset K)")
    e.add_argument("--rate", type=_pos_float, default=4.0, help="mean request rate per serving node, req/s")
    e.add_argument("--mig-profile", default=None,
                   help="MIG: a profile for every GPU (1g.10gb) or per GPU (0=1g.10gb,3=3g.40gb)")
    e.add_argument("--k8s-map", default=None, help="YAML/JSON file: hostname -> GPU index -> {pod, namespace, container}")
    e.add_argument("--releases", default=_env("RELEASES"), help="release catalogue YAML (default: packaged)")
    e.set_defaults(func=cmd_exporter)

    g = sub.add_parser("pager", help="Alertmanager webhook receiver storing pages in SQLite")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=PORT, default=9097)
    g.add_argument("--db", default=str(Path(run_dir) / "pager.sqlite"))
    g.add_argument("--runbooks-dir", default=None, help="serve runbooks/*.md from here under /runbooks/")
    g.set_defaults(func=cmd_pager)

    f = sub.add_parser("fault", help="inject, list and clear faults on the simulated nodes")
    fsub = f.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--run-dir", default=run_dir)
    common.add_argument("--node", type=_int_range(0, 4095), help="node index")
    common.add_argument("--url", help="node base URL instead of the run directory's stack (http://127.0.0.1:9400)")
    common.add_argument("--token", help="admin token (default: from the run directory; env GPUOBS_ADMIN_TOKEN)")
    common.add_argument("--json", action="store_true")
    fi = fsub.add_parser("inject", parents=[common], help="inject a fault: gpuobs fault inject --node 2 --gpu 3 xid --code 48")
    fi.add_argument("--gpu", type=_int_range(0, 15))
    ksub = fi.add_subparsers(dest="kind", required=True, metavar="KIND")
    from gpuobs.exporter.faults import KINDS
    for kind in KINDS.values():
        kp = ksub.add_parser(kind.name, help=kind.help)
        for name, spec in kind.params.items():
            kp.add_argument(f"--{name.replace('_', '-')}", dest=name, type=_finite(spec.type),
                            required=spec.required, help=spec.help)
        kp.set_defaults(param_names=list(kind.params))
    fi.set_defaults(func=cmd_fault)
    fc = fsub.add_parser("clear", parents=[common], help="clear faults by id (or --all) on one node")
    fc.add_argument("ids", nargs="*")
    fc.add_argument("--all", action="store_true")
    fc.set_defaults(func=cmd_fault)
    fl = fsub.add_parser("list", parents=[common], help="list active faults (all nodes unless --node)")
    fl.set_defaults(func=cmd_fault)

    s = sub.add_parser("stack", help="run the native stack: up | down | status",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("action", choices=["up", "down", "status"])
    s.add_argument("--run-dir", default=run_dir, help="state, configs, logs (env GPUOBS_RUN_DIR)")
    s.add_argument("--nodes", type=_int_range(1, 256), default=_env("NODES", "4"), help="simulated nodes (GPUOBS_NODES)")
    s.add_argument("--gpus", type=_int_range(1, 16), default=_env("GPUS", "8"), help="GPUs per node (GPUOBS_GPUS)")
    s.add_argument("--seed", type=int, default=1, help="RNG seed of the fleet")
    s.add_argument("--prometheus-port", type=PORT, default=_env("PROMETHEUS_PORT", "9090"), help="GPUOBS_PROMETHEUS_PORT")
    s.add_argument("--alertmanager-port", type=PORT, default=_env("ALERTMANAGER_PORT", "9093"), help="GPUOBS_ALERTMANAGER_PORT")
    s.add_argument("--pager-port", type=PORT, default=_env("PAGER_PORT", "9097"), help="GPUOBS_PAGER_PORT")
    s.add_argument("--base-port", type=PORT, default=_env("BASE_PORT", "9400"), help="first node port")
    s.add_argument("--rate", type=_pos_float, default=_env("RATE", "4"),
                   help="mean request rate per serving node, req/s (default 4; the simulated engine's KV cache "
                        "saturates above ~7 req/s, which then queues and slows TTFT like a real overloaded engine)")
    s.add_argument("--grafana-port", type=PORT, default=_env("GRAFANA_PORT", "3000"),
                   help="Grafana, started only if a grafana binary is on PATH")
    s.add_argument("--engine-base-port", type=PORT, default=_env("ENGINE_BASE_PORT", "8000"),
                   help="first serving-engine port")
    s.add_argument("--training-nodes", type=_int_range(0, 255), default=_env("TRAINING_NODES", "1"),
                   help="the last N nodes run training instead of serving (default 1)")
    s.add_argument("--xid-window-ms", type=_int_range(1000, 86_400_000), default=15_000,
                   help="exporter Xid window for the local stack (default 15000 so drills resolve in ~1.5 min)")
    s.add_argument("--runbook-base", default=_env("RUNBOOK_BASE"), help="runbook_url base (default: the pager)")
    s.add_argument("--profile", choices=["default", "drill"], default=_env("PROFILE", "default"),
                   help="default: the rule files as they are; drill: `for:` capped at 20s and a 1d SLO period "
                        "so every drill fires and resolves in minutes (see gpuobs/stack/render.py)")
    s.add_argument("--timeout", type=_pos_float, default=90.0, help="start-up deadline, seconds")
    s.set_defaults(func=cmd_stack)

    from gpuobs.stack.drills import DRILLS
    d = sub.add_parser("drill", help="failure drills on the running stack: inject, page, clear, resolve")
    d.add_argument("drill", choices=[*DRILLS, "all", "soak"],
                   help="drill name, all (lanes in parallel, then slo-burn), or soak (watch a healthy fleet)")
    d.add_argument("--minutes", type=_pos_float, default=30.0, help="soak: minutes to watch (default 30)")
    d.add_argument("--code", type=_int_range(1, 65535), default=48, help="xid drill: Xid code (default 48, DBE)")
    d.add_argument("--run-dir", default=run_dir)
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_drill)

    r = sub.add_parser("rules", help="generate rule files derived from reference data")
    r.add_argument("which", choices=["xid", "slo"])
    r.add_argument("--slo-config", default="prometheus/slo.yaml", help="SLO definitions (for `slo`)")
    r.add_argument("--period", default=None, help="override the SLO period, e.g. 3d (for `slo`)")
    r.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the generated text")
    r.set_defaults(func=cmd_rules)

    from gpuobs.canary.canary_cli import register as register_canary
    from gpuobs.canary.compat_cli import register as register_compat
    from gpuobs.canary.rollout_cli import register as register_rollout
    register_compat(sub)
    register_canary(sub)
    register_rollout(sub)
    from gpuobs.reports.report_cli import register as register_report
    register_report(sub)
    from gpuobs.logwatch.cli import register as register_logwatch
    register_logwatch(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``gpuobs`` console script."""
    args = build_parser().parse_args(argv)
    if hasattr(args, "param_names"):  # `fault inject <kind>`: collect that kind's parameters
        args.params = {n: getattr(args, n) for n in args.param_names}
    if str(args.log_level).lower() not in LOG_LEVELS:
        sys.exit(_fail(f"log level {args.log_level!r} (--log-level or GPUOBS_LOG_LEVEL) must be one of "
                       f"{', '.join(LOG_LEVELS)}"))
    log.setup(args.log_level)
    from gpuobs.stack.supervisor import StackError

    try:
        code = args.func(args)
    except StackError as exc:  # a damaged or missing stack.json, a bad run dir: the user's to fix
        code = _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
