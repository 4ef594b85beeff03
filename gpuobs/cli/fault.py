"""``gpuobs fault``: inject, list and clear faults on the simulated nodes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpuobs.cli.common import env, fail, finite, int_range, run_dir_default


def _node_urls(args: argparse.Namespace) -> tuple[list[str], str]:
    """Node base URLs and admin token, from --url/--token or the run directory's stack.json."""
    from gpuobs.stack.supervisor import load_state

    token = args.token or str(env("ADMIN_TOKEN") or "") or None
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
    if not state or not state.running:
        raise ValueError(f"no running stack in {args.run_dir}; start one with `make up` or pass --url/--token")
    return state.urls.node_bases, token or state.token()


def _describe(fault: dict) -> str:
    """One fault as text: ``xid on gpu 3: code=48, repeat_s=0``."""
    where = f"on gpu {fault['gpu']}" if fault.get("gpu") is not None else "node-wide"
    params = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in fault["params"].items())
    return f"{fault['kind']} {where}" + (f": {params}" if params else "")


def cmd_fault(args: argparse.Namespace) -> int:
    from gpuobs.promapi.exporter_admin import AdminClient, AdminError

    try:
        urls, token = _node_urls(args)
    except (ValueError, OSError) as exc:
        return fail(str(exc))
    if args.url:
        selected = [0]
    elif args.node is None:
        if args.action == "inject" or (args.action == "clear" and not args.all):
            return fail(f"--node is required (0..{len(urls) - 1})")
        selected = list(range(len(urls)))  # list, clear --all: every node
    elif not 0 <= args.node < len(urls):
        return fail(f"--node must be 0..{len(urls) - 1}, got {args.node}")
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
            host = fault.get("hostname") or urls[selected[0]]
            where = f"{host} ({urls[0]})" if args.url else f"node {selected[0]} ({host})"
            print(json.dumps(fault) if args.json else f"injected {fault['id']} on {where}: {_describe(fault)}")
        else:
            for n in selected:
                client = AdminClient(urls[n], token)
                ids = [f["id"] for f in client.list()] if args.all else args.ids
                if not ids and not args.all:
                    return fail("give fault ids to clear, or --all")
                for fid in ids:
                    client.clear(fid)
                    print(f"cleared {fid}" + (f" on node {n}" if len(selected) > 1 else ""))
        return 0
    except AdminError as exc:
        return fail(f"{exc}" + (f" (field: {exc.field})" if exc.field else ""), 2 if exc.status in (400, 401, 404, 413) else 1)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``fault`` group to ``sub``."""
    f = sub.add_parser("fault", help="inject, list and clear faults on the simulated nodes")
    fsub = f.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--run-dir", default=run_dir_default(),
                        help="run directory of the stack whose nodes to use (env GPUOBS_RUN_DIR; default %(default)s)")
    common.add_argument("--node", type=int_range(0, 4095), help="node index")
    common.add_argument("--url", help="node base URL instead of the run directory's stack (http://127.0.0.1:9400)")
    common.add_argument("--token", help="admin token (default: from the run directory; env GPUOBS_ADMIN_TOKEN)")
    common.add_argument("--json", action="store_true", help="print the admin API's JSON")
    fi = fsub.add_parser("inject", parents=[common], help="inject a fault: gpuobs fault inject --node 2 --gpu 3 xid --code 48")
    fi.add_argument("--gpu", type=int_range(0, 15), help="GPU index on the node: required by the per-GPU kinds "
                                                           "(xid, thermal ...), refused by the node-wide ones")
    ksub = fi.add_subparsers(dest="kind", required=True, metavar="KIND")
    from gpuobs.exporter.sim.faults import KINDS
    for kind in KINDS.values():
        kp = ksub.add_parser(kind.name, help=kind.help)
        for name, spec in kind.params.items():
            kp.add_argument(f"--{name.replace('_', '-')}", dest=name, type=finite(spec.type),
                            required=spec.required,
                            help=spec.help + (f" (default {spec.default:g})" if isinstance(spec.default, (int, float))
                                              else f" (default {spec.default})" if spec.default is not None else ""))
        kp.set_defaults(param_names=list(kind.params))
    fi.set_defaults(func=cmd_fault)
    fc = fsub.add_parser("clear", parents=[common], help="clear faults by id (or --all) on one node")
    fc.add_argument("ids", nargs="*", help="fault ids (from `fault list`)")
    fc.add_argument("--all", action="store_true", help="clear every fault on the node")
    fc.set_defaults(func=cmd_fault)
    fl = fsub.add_parser("list", parents=[common], help="list active faults (all nodes unless --node)")
    fl.set_defaults(func=cmd_fault)
