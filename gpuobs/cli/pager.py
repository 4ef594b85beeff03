"""``gpuobs pager``: the Alertmanager webhook receiver."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuobs.cli.common import PORT, fail, run_dir_default


def cmd_pager(args: argparse.Namespace) -> int:
    import sqlite3

    from gpuobs.pager.server import serve

    if args.runbooks_dir and not Path(args.runbooks_dir).is_dir():
        return fail(f"--runbooks-dir {args.runbooks_dir} is not a directory")
    try:
        serve(args.host, args.port, Path(args.db), Path(args.runbooks_dir) if args.runbooks_dir else None)
    except sqlite3.Error as exc:
        return fail(f"--db {args.db}: not a usable SQLite database ({exc})")
    except OSError as exc:
        return fail(f"pager cannot start on {args.host}:{args.port} with --db {args.db}: {exc}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``pager`` group to ``sub``."""
    g = sub.add_parser("pager", help="Alertmanager webhook receiver storing pages in SQLite")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=PORT, default=9097)
    g.add_argument("--db", default=str(Path(run_dir_default()) / "pager.sqlite"))
    g.add_argument("--runbooks-dir", default=None, help="serve runbooks/*.md from here under /runbooks/")
    g.set_defaults(func=cmd_pager)
