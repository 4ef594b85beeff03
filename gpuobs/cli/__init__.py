"""The ``gpuobs`` command: one module per command group, registered from :data:`GROUPS`.

Each group module has ``register(subparsers)``; its leaves set ``func(args) -> int`` (the exit code).
:func:`run` (through :func:`dispatch`) maps the error hierarchy of :mod:`gpuobs.core.errors` to exit
codes (0 success, 1 failure, 2 usage or input error, 3 inconclusive, 4 could not judge: backend
error, 130 interrupted) and prints every user error as one line ``gpuobs <group>: error: ...``;
nothing below the CLI prints errors or picks exit codes.
Flags fall back to ``GPUOBS_*`` environment variables where their help says so.

To add a group: write ``gpuobs/cli/<group>.py`` with ``register`` and add it to :data:`GROUPS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gpuobs import __version__
from gpuobs.cli import common
from gpuobs.cli.common import LOG_LEVELS, env, fail
from gpuobs.core import log
from gpuobs.core.errors import EXIT_INTERRUPTED, GpuobsError

#: Command groups in the order ``gpuobs --help`` lists them (module names under gpuobs.cli).
GROUPS = ("exporter", "logwatch", "pager", "incident", "fault", "stack", "compose", "drill", "rules", "doctor", "compat", "canary", "rollout", "flag", "upgrade", "remediate", "report")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every group registered)."""
    p = common.Parser(prog="gpuobs", description="Observability and release safety for GPU platforms.")
    p.add_argument("--version", action="version", version=f"gpuobs {__version__}")
    p.add_argument("--log-level", default=env("LOG_LEVEL", "info"), choices=LOG_LEVELS, type=str.lower,
                   help="JSON log level on stderr (env GPUOBS_LOG_LEVEL; default info)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        importlib.import_module(f"gpuobs.cli.{group}").register(sub)
    return p


def run(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the command, return its exit code (what the tests call)."""
    try:
        args = build_parser().parse_args(argv)
    except common.EnvError as exc:  # a bad GPUOBS_* default: one line naming the variable
        common.GROUP[:] = [exc.group] if exc.group else []
        return fail(exc)
    common.GROUP[:] = [args.command]
    common.ARGS[:] = [args]
    if hasattr(args, "param_names"):  # `fault inject <kind>`: collect that kind's parameters
        args.params = {n: getattr(args, n) for n in args.param_names}
    if str(args.log_level).lower() not in LOG_LEVELS:
        return fail(f"log level {args.log_level!r} (--log-level or GPUOBS_LOG_LEVEL) must be one of "
                    f"{', '.join(LOG_LEVELS)}")
    log.setup(args.log_level)
    return dispatch(args)


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command, ``args.func(args)``, and return its exit code: the one mapping of a
    :class:`~gpuobs.core.errors.GpuobsError` to its ``exit_code`` and error line (tests that build
    a group's parser alone call this too)."""
    try:
        return args.func(args)
    except GpuobsError as exc:  # a damaged stack.json, a bad run dir, a bad file: the user's to fix
        return fail(exc, exc.exit_code)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``gpuobs`` console script."""
    sys.exit(run(argv))
