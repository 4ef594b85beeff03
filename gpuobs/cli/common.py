"""What every command group shares: ``GPUOBS_*`` environment defaults, argparse value types and the
one error line format ``gpuobs <group>: error: <message>`` (exit codes: :mod:`gpuobs.core.errors`)."""

from __future__ import annotations

import argparse
import os
import re
import sys

from gpuobs.core.durations import DurationError, parse_duration
from gpuobs.core.errors import EXIT_USAGE, InputError

#: The command group being run (``stack``, ``canary`` ...); set by :func:`gpuobs.cli.run`.
GROUP: list[str] = []


class EnvValue(str):
    """A flag's default read from ``$GPUOBS_<name>`` (:func:`env`): a str that remembers its variable, so
    :class:`Parser` checks it with the flag's own type and choices and names the variable if it is bad."""

    var: str = ""


def env(name: str, default: str | None = None) -> str | None:
    """``$GPUOBS_<name>`` (an :class:`EnvValue`) or ``default``."""
    value = os.environ.get(f"GPUOBS_{name}")
    if value is None:
        return default
    out = EnvValue(value)
    out.var = f"GPUOBS_{name}"
    return out


def named(flag: str, value: object, var: str = "") -> str:
    """``flag``, or ``flag (GPUOBS_<var>)`` when ``value`` is what that variable holds (the flag's default,
    :func:`env`): how a check after parsing names what the user set."""
    name = getattr(value, "var", "") or (f"GPUOBS_{var}" if var and os.environ.get(f"GPUOBS_{var}") == str(value)
                                         else "")
    return f"{flag} ({name})" if name else flag


def http_url(flag: str, value: str, var: str = "") -> str:
    """``value`` if it is an http(s) URL with a host; else InputError naming ``flag`` (and its variable
    ``GPUOBS_<var>`` when the value came from there)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 1) > 0
    except ValueError:  # a bad port, e.g. http://host:99999
        ok = False
    if not ok:
        raise InputError(f"{named(flag, value, var)}: {str(value)!r} is not valid; expected an http:// or https:// URL, "
                         "e.g. http://127.0.0.1:9097")
    return value


class EnvError(InputError):
    """A ``GPUOBS_*`` variable holds a value its flag would refuse: one line naming the variable, the
    flag and what is allowed (exit 2), raised while parsing, before anything runs or is written."""

    def __init__(self, prog: str, var: str, value: str, flag: str, problem: str):
        self.group = prog.split()[1] if len(prog.split()) > 1 else ""
        super().__init__(f"{var}={value!r} (the default of {flag}) is not valid: {problem}")


class Parser(argparse.ArgumentParser):
    """The ``gpuobs`` argument parser: a ``GPUOBS_*`` default (:class:`EnvValue`) goes through its flag's
    type and choices like a value on the command line (argparse converts a string default with the type
    but never checks its choices, and blames the flag), and a subcommand reports the arguments it does
    not know with its own usage and prog (``gpuobs drill: error: unrecognized arguments: --bogus``), not
    the top level's."""

    def add_subparsers(self, **kwargs):
        kwargs.setdefault("parser_class", SubParser)
        return super().add_subparsers(**kwargs)

    def _get_value(self, action, arg_string):
        var = getattr(arg_string, "var", None)
        if not var:
            return super()._get_value(action, arg_string)
        flag = "/".join(action.option_strings) or action.dest
        try:
            value = super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:
            problem = exc.message
            if problem.startswith("invalid int value"):
                problem = "expected an integer"
            elif problem.startswith("invalid float value"):
                problem = "expected a number"
            raise EnvError(self.prog, var, str(arg_string), flag, problem) from None
        if action.choices is not None and value not in action.choices:
            raise EnvError(self.prog, var, str(arg_string), flag,
                           f"expected one of {', '.join(map(str, action.choices))}")
        return str(value) if isinstance(value, EnvValue) else value  # a plain str from here on (YAML, SQLite)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default as ``(default: X)`` once: not where its help already says it (``default
    4``, ``(default: the pager)``, ``%(default)s``), and not for a default of None or a switch's False."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.default is False or DEFAULT_SAID.search(text):
            return text
        return super()._get_help_string(action)


#: A help text that gives its flag's default itself (see :class:`HelpFormatter`).
DEFAULT_SAID = re.compile(r"[(;,]\s*default\b|%\(default\)")


class SubParser(Parser):
    """A command group's (or subcommand's) parser: unrecognized arguments are its usage error."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


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


def add_fleet_hardware_flags(p: argparse.ArgumentParser, gpu_models_note: str = "") -> None:
    """``--gpu-models`` and ``--drivers``, the simulated fleet's hardware, defined once for every command
    that builds a fleet (``exporter``, ``stack``); ``gpu_models_note`` adds what that command does with
    the models. The short names come from :data:`gpuobs.exporter.sim.gpu.GPU_MODELS`."""
    from gpuobs.exporter.sim.gpu import GPU_MODELS

    p.add_argument("--gpu-models", default=env("GPU_MODELS", ""), metavar="MODEL:COUNT,...",
                   help="GPU models of the serving nodes in node order, e.g. H100:19,L40S:1 (counts sum to --nodes "
                        f"minus --training-nodes; models: {', '.join(GPU_MODELS)}); training nodes are H100; "
                        f"{gpu_models_note}default every node H100 (env GPUOBS_GPU_MODELS)")
    p.add_argument("--drivers", default=env("DRIVERS"), metavar="FILE",
                   help="driver catalogue YAML the nodes' install-driver action accepts (default: packaged "
                        "gpuobs/reference/data/drivers.yaml; env GPUOBS_DRIVERS)")
