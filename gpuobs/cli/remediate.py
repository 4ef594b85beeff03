"""``gpuobs remediate``: the remediation controller (serve) and a person's commands (status, hold,
release, breaker close). Thin commands over :mod:`gpuobs.remediate`; the database is
``<run>/remediate.sqlite`` unless ``--db`` names another, and the commands other than ``serve`` work
on it directly, so they work while the controller is down and it applies them at its next tick."""

from __future__ import annotations

import argparse
import getpass
import json
import sqlite3
import time
from pathlib import Path

from gpuobs.cli.common import PORT, env, fail, fleet_config, named, pos_float, run_dir_default
from gpuobs.core.errors import EXIT_FAILURE


def _db(args: argparse.Namespace) -> Path:
    return Path(args.db) if args.db else Path(args.run_dir) / "remediate.sqlite"


def _store(args: argparse.Namespace, must_exist: bool = True):
    from gpuobs.remediate.store import RemediationStore

    path = _db(args)
    if must_exist and not path.exists():
        raise FileNotFoundError(f"no remediation database at {path} (--db, or --run-dir of a stack running "
                                "`gpuobs remediate serve`)")
    return RemediationStore(path)


def _db_error(args: argparse.Namespace, exc: BaseException) -> int:
    """The one-line error for a database that cannot be opened, read or written (corrupt, read-only)."""
    if isinstance(exc, FileNotFoundError):
        return fail(str(exc))
    return fail(f"--db {_db(args)}: {' '.join(str(exc).split()) or type(exc).__name__}")


def _config(args: argparse.Namespace):
    from gpuobs.remediate.config import RemediationConfig, parse_config

    cfg = RemediationConfig()
    if args.config:
        import yaml

        try:
            doc = yaml.safe_load(Path(args.config).read_text())
        except OSError as exc:
            return fail(f"--config {args.config}: {exc.strerror or exc}")
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            return fail(f"--config {args.config}: not valid YAML{where}")
        cfg = parse_config(doc)
    if args.mode:
        cfg = parse_config({"mode": args.mode}, cfg, prefix="--mode")
    return cfg


def _actions(args: argparse.Namespace):
    """The node-action adapter ``--adapter`` names."""
    if args.adapter == "sim":
        from gpuobs.stack.supervisor import load_state

        stack = load_state(Path(args.run_dir))
        if stack is None:
            raise FileNotFoundError(f"--adapter sim needs a stack started from --run-dir {args.run_dir} "
                                    "(its stack.json): run `make up` or pass --run-dir")
        from gpuobs.remediate.adapters.sim import SimActions

        return SimActions(stack)
    from gpuobs.remediate.adapters.kubernetes import KubeActions

    return KubeActions.from_kubeconfig(args.kubeconfig, pool_label=args.pool_label,
                                       node_selector=args.node_selector, namespace=args.namespace,
                                       image=args.reset_image)


def cmd_serve(args: argparse.Namespace) -> int:
    from gpuobs.core import tokens
    from gpuobs.rollout.store import RunLock

    cfg = _config(args)
    if isinstance(cfg, int):
        return cfg
    if not args.token_file and not args.no_auth:
        return fail("--token-file FILE is required (the webhook needs Authorization: Bearer <token>); "
                    "--no-auth accepts unauthenticated webhooks")
    try:
        token = None if args.no_auth else tokens.load_or_create(Path(args.token_file))
    except tokens.TokenError as exc:
        return fail(f"--token-file: {exc}")
    if not args.prometheus.startswith(("http://", "https://")):
        return fail(f"{named('--prometheus', args.prometheus, 'PROMETHEUS_URL')} {args.prometheus!r}: expected an http:// or https:// URL")
    fleet = fleet_config(args.fleet)
    db = _db(args)
    lock = RunLock(db.parent, db.name + ".lock")  # one controller per database: two would both act
    try:
        if not lock.acquire():
            return fail(f"another `gpuobs remediate serve` holds {lock.path} (one controller per database; "
                        "stop it first, or pass another --db)")
    except OSError as exc:
        return fail(f"--db {db}: cannot take the controller lock {lock.path}: {exc.strerror or exc}")
    try:
        return _serve(args, cfg, token, fleet)
    finally:
        lock.release()


def _serve(args: argparse.Namespace, cfg, token: str | None, fleet) -> int:
    """``serve`` once it holds the database's controller lock."""
    from gpuobs.promapi.prometheus import PromClient
    from gpuobs.remediate.adapters.prom import PromSignals
    from gpuobs.remediate.controller import Controller
    from gpuobs.remediate.interfaces import ActionError
    from gpuobs.remediate.server import serve
    from gpuobs.remediate.store import RemediationStore

    try:
        actions = _actions(args)
        store = RemediationStore(_db(args))
    except (FileNotFoundError, ActionError) as exc:
        return fail(str(exc))
    except sqlite3.Error as exc:
        return fail(f"--db {_db(args)}: not a usable SQLite database ({exc})")
    signals = PromSignals(PromClient(args.prometheus, timeout=5.0, retries=1), fleet.identity_label,
                          Path(args.run_dir))
    notifier = None
    if args.alertmanager:
        from gpuobs.remediate.notices import Notifier

        bad = [u for u in args.alertmanager if not u.startswith(("http://", "https://"))]
        if bad:
            return fail(f"--alertmanager {bad[0]!r}: expected an http:// or https:// URL")
        notifier = Notifier(args.alertmanager, args.runbook_base or fleet.runbook_base)
    controller = Controller(store, actions, signals, cfg, fleet.identity_label, notifier=notifier)
    try:
        serve(args.host, args.port, controller, token, args.interval)
    except OSError as exc:
        return fail(f"remediate cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", EXIT_FAILURE)
    return 0


def _fmt_ts(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + "Z" if ts else "-"


def status_text(doc: dict) -> str:
    """The human view of :meth:`Controller.status`-shaped data."""
    b = doc["breaker"]
    lines = [f"mode: {doc['mode']}",
             "breaker: " + (f"OPEN since {_fmt_ts(b['opened_at'])}: {b['reason']}" if b["open"] else "closed")]
    out = doc["out_of_service"]
    lines.append(f"out of service: {len(out)}" + "".join(
        f"\n  {e['node']:<16} {e['pool']:<10} {e['state']:<11} {e['alertname']} -> {e['action']} "
        f"(attempts {e['attempts']}) {e['reason']}" for e in out))
    pending = [e for e in doc["open"] if e["state"] == "pending"]
    lines.append(f"pending: {len(pending)}" + "".join(
        f"\n  {e['node']:<16} {e['alertname']} -> {e['action']}" for e in pending))
    holds = doc["holds"]
    lines.append(f"holds: {len(holds)}" + "".join(
        f"\n  {n:<16} by {h['by']}: {h['reason']}" for n, h in sorted(holds.items())))
    lines.append("recent episodes:" + "".join(
        f"\n  #{e['id']:<4} {e['node']:<16} {e['state']:<11} {e['alertname']} -> {e['action']}: {e['reason']}"
        for e in doc["recent"][:10]))
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    from gpuobs.remediate.store import OPEN_STATES

    try:
        store = _store(args)
    except (FileNotFoundError, sqlite3.Error) as exc:
        return _db_error(args, exc)
    try:
        doc = {"mode": "(read from the database; the running controller's is on /api/status)",
               "breaker": store.breaker(), "holds": store.holds(),
               "open": [e.to_dict() for e in store.episodes(OPEN_STATES)],
               "out_of_service": [e.to_dict() for e in store.out_of_service()],
               "recent": [e.to_dict() for e in store.episodes(limit=20)]}
        if args.node:
            doc["timeline"] = store.timeline(node=args.node)
    except sqlite3.Error as exc:
        return _db_error(args, exc)
    finally:
        store.close()
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(status_text(doc))
    for e in doc.get("timeline", []):
        print(f"  {_fmt_ts(e['ts'])} {e['actor']:<24} {e['kind']:<14} {e['detail']}")
    return 0


def _person(args: argparse.Namespace) -> str:
    return args.by or str(env("OPERATOR") or "") or getpass.getuser()


def cmd_hold(args: argparse.Namespace) -> int:
    try:
        store = _store(args, must_exist=False)
    except sqlite3.Error as exc:
        return _db_error(args, exc)
    try:
        store.hold(args.node, _person(args), args.reason or "held by a person")
    except sqlite3.Error as exc:
        return _db_error(args, exc)
    finally:
        store.close()
    print(f"{args.node}: held by {_person(args)}; the controller stops any remediation of it at its next tick "
          "and takes no action until `gpuobs remediate release`")
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    try:
        store = _store(args)
    except (FileNotFoundError, sqlite3.Error) as exc:
        return _db_error(args, exc)
    try:
        done = store.release(args.node, _person(args), args.reason or "released by a person")
    except sqlite3.Error as exc:
        return _db_error(args, exc)
    finally:
        store.close()
    if not done:
        return fail(f"{args.node}: no hold and no escalation to release", EXIT_FAILURE)
    print(f"{args.node}: released; new alerts for it may be remediated again (its cordon is left as it is)")
    return 0


def cmd_breaker_close(args: argparse.Namespace) -> int:
    try:
        store = _store(args)
    except (FileNotFoundError, sqlite3.Error) as exc:
        return _db_error(args, exc)
    from gpuobs.remediate.config import RemediationConfig
    from gpuobs.remediate.controller import Controller

    try:
        c = Controller(store, None, None, RemediationConfig(), "node")  # type: ignore[arg-type]
        done = c.close_breaker(_person(args), args.reason or "closed by a person")
    except sqlite3.Error as exc:
        return _db_error(args, exc)
    finally:
        store.close()
    if not done:
        return fail("the breaker is not open", EXIT_FAILURE)
    print("breaker closed; episodes pending behind it were cancelled; new alerts are remediated again")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``remediate`` group to ``sub``."""
    g = sub.add_parser("remediate", help="interlocked remediation of GPU faults (quarantine, drain, act, verify)",
                       description="The remediation controller and a person's commands (docs/remediation.md).")
    gs = g.add_subparsers(dest="remediate_cmd", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--run-dir", default=run_dir_default(), help="the stack's run directory (default %(default)s)")
        p.add_argument("--db", default=None, help="the controller's SQLite database (default <run-dir>/remediate.sqlite)")

    s = gs.add_parser("serve", help="run the controller: webhook receiver, loop, API, metrics")
    common(s)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    s.add_argument("--port", type=PORT, default=9098, help="port to listen on (default %(default)s)")
    s.add_argument("--token-file", default=None, metavar="FILE",
                   help="bearer token the webhook requires (created, mode 0600, if missing)")
    s.add_argument("--no-auth", action="store_true", help="accept webhooks without a token (not recommended)")
    s.add_argument("--mode", default=None, choices=("observe", "dry-run", "enforce"),
                   help="override the config's mode (default: the config's, dry-run when none)")
    s.add_argument("--config", default=None, metavar="FILE", help="YAML settings (gpuobs/remediate/config.py)")
    s.add_argument("--prometheus", default=env("PROMETHEUS_URL", "http://127.0.0.1:9090"),
                   help="Prometheus whose ALERTS the verification reads (env GPUOBS_PROMETHEUS_URL; default %(default)s)")
    s.add_argument("--alertmanager", action="append", default=[], metavar="URL",
                   help="Alertmanager that gets the RemediationHalted page and RemediationEscalated tickets "
                        "(repeat for each member of a cluster; default: none, notices off)")
    s.add_argument("--runbook-base", default=None, metavar="URL",
                   help="where the notices' runbook links point (default: the fleet config's runbook_base)")
    s.add_argument("--fleet", default=env("FLEET_CONFIG"), metavar="FILE",
                   help="fleet config naming the node identity label (env GPUOBS_FLEET_CONFIG)")
    s.add_argument("--interval", type=pos_float, default=1.0, help="seconds between loop ticks (default %(default)s)")
    s.add_argument("--adapter", default="sim", choices=("sim", "kubernetes"),
                   help="node actions: the simulated stack's admin API or the Kubernetes API (default %(default)s)")
    s.add_argument("--kubeconfig", default=None, help="kubernetes: kubeconfig file (default: in-cluster, then ~/.kube/config)")
    s.add_argument("--pool-label", default="nvidia.com/gpu.product", help="kubernetes: node label naming the pool")
    s.add_argument("--node-selector", default="nvidia.com/gpu.present=true", help="kubernetes: the GPU nodes")
    s.add_argument("--namespace", default="gpuobs", help="kubernetes: namespace of the reset and diag Jobs")
    s.add_argument("--reset-image", default="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                   help="kubernetes: image of the GPU reset and diag Jobs")
    s.set_defaults(func=cmd_serve)

    st = gs.add_parser("status", help="nodes out of service, the breaker, holds, recent episodes")
    common(st)
    st.add_argument("--node", default=None, help="also print this node's timeline")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.set_defaults(func=cmd_status)

    for name, fn, text in (("hold", cmd_hold, "stop any remediation of NODE and take no action on it"),
                           ("release", cmd_release, "end a hold or an escalation on NODE")):
        p = gs.add_parser(name, help=text)
        common(p)
        p.add_argument("node", metavar="NODE", help="node name, as the controller's timeline shows it")
        p.add_argument("--reason", default="", help="why (on the timeline)")
        p.add_argument("--by", default=None, help="who (default $GPUOBS_OPERATOR or the login name)")
        p.set_defaults(func=fn)

    b = gs.add_parser("breaker", help="the fleet circuit breaker")
    bs = b.add_subparsers(dest="breaker_cmd", required=True, metavar="COMMAND")
    bc = bs.add_parser("close", help="close the open breaker (after the fleet-wide cause is handled)")
    common(bc)
    bc.add_argument("--reason", default="", help="why (on the timeline)")
    bc.add_argument("--by", default=None, help="who (default $GPUOBS_OPERATOR or the login name)")
    bc.set_defaults(func=cmd_breaker_close)
