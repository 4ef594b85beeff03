"""What every command group shares: ``GPUOBS_*`` environment defaults, argparse value types and the
one error line format ``gpuobs <group>: error: <message>`` (exit codes: :mod:`gpuobs.core.errors`)."""

from __future__ import annotations

import argparse
import os
import sys

from gpuobs.core.durations import DurationError, parse_duration
from gpuobs.core.errors import EXIT_USAGE

#: The command group being run (``stack``, ``canary`` ...); set by :func:`gpuobs.cli.run`.
GROUP: list[str] = []


def env(name: str, default: str | None = None) -> str | None:
    """``$GPUOBS_<name>`` or ``default``."""
    return os.environ.get(f"GPUOBS_{name}", default)


def run_dir_default() -> str:
    """The run directory flags default to: ``$GPUOBS_RUN_DIR`` or ``.run``."""
    return env("RUN_DIR", ".run") or ".run"


#: The parsed arguments of the command being run (set by :func:`gpuobs.cli.run`): which URL flags it has.
ARGS: list[argparse.Namespace] = []

#: component of a :func:`gpuobs.core.reach.unreachable` message -> (argparse dest, flag) that sets its URL.
URL_FLAGS = {
    "pager": (("pager_url", "--pager-url"),),
    "Alertmanager": (("alertmanager_url", "--alertmanager-url"), ("alertmanager", "--alertmanager")),
    "Prometheus": (("prometheus", "--prometheus"),),
    "remediation controller": (("remediate_url", "--remediate-url"),),
    "node's admin API": (("url", "--url"),),
}


def reach_hint(msg: str) -> str:
    """``msg`` plus how to fix it when it says a server cannot be reached (:mod:`gpuobs.core.reach`):
    start the stack, or pass the command's URL flag of that component."""
    from gpuobs.core.reach import PATTERN

    m = PATTERN.search(msg)
    if not m or "make up" in msg:
        return msg
    args = ARGS[0] if ARGS else argparse.Namespace()
    flag = next((f for dest, f in URL_FLAGS.get(m.group(1), ()) if hasattr(args, dest)), None)
    return f"{msg}; start the stack with `make up`" + (f" or pass {flag} URL" if flag else "")


def fail(msg: object, code: int = EXIT_USAGE) -> int:
    """Print ``gpuobs <group>: error: msg`` on stderr and return ``code`` (the exit code). A message
    that a server cannot be reached gets how to fix it appended (:func:`reach_hint`)."""
    where = " ".join(["gpuobs", *GROUP[:1]])
    print(f"{where}: error: {reach_hint(str(msg))}", file=sys.stderr)
    return code


def int_range(lo: int, hi: int):
    """argparse type: an integer in ``lo..hi``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer {lo}..{hi}, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer {lo}..{hi}, got {value}")
        return value
    return parse


def pos_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def finite(kind: type):
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


def duration(text: str) -> float:
    """argparse type: a duration in the one grammar (:mod:`gpuobs.core.durations`), seconds."""
    try:
        return parse_duration(text, "duration")
    except DurationError as exc:
        raise argparse.ArgumentTypeError(f"expected {exc.accepted}, got {text!r}") from None


PORT = int_range(1, 65535)
LOG_LEVELS = ["debug", "info", "warning", "error"]


def fleet_config(value: str | None):
    """The fleet config a ``--fleet FILE`` flag (default ``$GPUOBS_FLEET_CONFIG``) names, or the default
    one when neither is given (:class:`gpuobs.core.fleet.FleetConfig`). Raises FleetConfigError (an
    input error: one line, exit 2) naming the flag, and the variable when it is set."""
    from pathlib import Path

    from gpuobs.core.fleet import FleetConfig, load_fleet

    if not value:
        return FleetConfig()
    flag = "--fleet (or GPUOBS_FLEET_CONFIG)" if env("FLEET_CONFIG") else "--fleet"
    return load_fleet(Path(value), flag)
