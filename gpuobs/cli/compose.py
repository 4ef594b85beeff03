"""``gpuobs compose``: the compose stack (check, up, down, status); ``make up`` picks it when Docker,
Compose and the images are all there (docs/compose.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuobs.cli.common import HelpFormatter, run_dir_default
from gpuobs.core.errors import EXIT_FAILURE


def cmd_compose(args: argparse.Namespace) -> int:
    """Run one compose action; ComposeError (a Failure) is printed by the CLI with exit 1."""
    from gpuobs.stack import compose

    run_dir = Path(args.run_dir)
    if args.action == "check":
        ok, reason, extras = compose.check(topology=args.topology)
        print(reason + (f"; optional services with their image loaded: {', '.join(extras) or 'none'}" if ok else ""))
        return 0 if ok else EXIT_FAILURE
    if args.action == "up":
        run_dir.mkdir(parents=True, exist_ok=True)
        st = compose.up(run_dir, args.project, topology=args.topology)
        u = st["urls"]
        if args.topology == "ha":
            print(f"compose HA profile up (project {st['project']}, {st['nodes']} node containers; 2 shards x 2 "
                  f"replicas, 3 Alertmanagers, VictoriaMetrics, vmalert; docs/ha.md):\n"
                  f"  VictoriaMetrics {u['prometheus']}  (global Prometheus API)\n"
                  f"  Pager           {u['pager']}  (/api/pages, /runbooks/)\n"
                  f"  Members         docker compose -p {st['project']} --profile ha ps")
        else:
            print(f"compose stack up (project {st['project']}, {st['nodes']} node containers):\n"
                  f"  Prometheus    {u['prometheus']}\n  Alertmanager  {u['alertmanager']}\n"
                  f"  Pager         {u['pager']}  (/api/pages, /runbooks/)")
        for p in ("grafana", "jaeger"):
            print(f"  {p.capitalize():<13} " + ("started" if p in st["profiles"] else
                  "not started: its image is not loaded (docs/compose.md, docker load)"))
        print("Try: make drill-xid    Stop: make down" if args.topology == "single" else "Stop: make down")
        return 0
    if args.action == "down":
        compose.down(run_dir, volumes=args.volumes)
        return 0
    print(compose.status(run_dir), end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``compose`` group to ``sub``."""
    c = sub.add_parser("compose", help="the compose stack: check | up | down | status (docs/compose.md)",
                       formatter_class=HelpFormatter)
    c.add_argument("action", choices=["check", "up", "down", "status"],
                   help="check: can compose run here; up: start the stack; down: stop it; status: its containers")
    c.add_argument("--run-dir", default=run_dir_default(), help="where compose.json is kept (env GPUOBS_RUN_DIR)")
    c.add_argument("--project", default="gpuobs", help="compose project name")
    c.add_argument("--topology", choices=["single", "ha"], default="single",
                   help="check/up: the single stack, or the Compose profile ha (the HA topology of make up-ha, "
                        "in containers; docs/compose.md)")
    c.add_argument("--volumes", action="store_true", help="down: also delete the data volumes")
    c.set_defaults(func=cmd_compose)
