"""``gpuobs rules``: the generated artefacts of :mod:`gpuobs.mixin`.

``render`` writes every rule file, the Alertmanager config and the dashboards from a fleet config
(``prometheus/fleet.yaml`` by default; :mod:`gpuobs.mixin.render`); ``xid``/``slo`` print one rule
file, ``dashboards`` writes only the dashboards (the earlier entry points, kept for scripts).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuobs.cli.common import fail
from gpuobs.core import assets
from gpuobs.core.errors import EXIT_FAILURE, InputError


def cmd_rules(args: argparse.Namespace) -> int:
    """Dispatch on ``which``."""
    if args.period and args.which != "slo":
        return fail(f"--period applies to `gpuobs rules slo` only (the rendered slo.yml keeps prometheus/slo.yaml's "
                    f"period); got it with {args.which!r}")
    if args.which == "render":
        return _render(args)
    if args.which == "dashboards":
        return _dashboards(args)
    if args.which == "kubernetes":
        return _kubernetes(args)
    from gpuobs.mixin.kernel_log_rules import render as render_kernel_log_rules
    from gpuobs.mixin.slo_rules import render_slo_rules
    from gpuobs.mixin.render import rule_texts

    slo_config = Path(args.slo_config) if args.slo_config else assets.path("prometheus/slo.yaml")
    try:
        text = {"xid": lambda: rule_texts(_fleet(args))["prometheus/rules/gpu-xid.yml"],
                "kernel-log": lambda: render_kernel_log_rules(_fleet(args)),
                "slo": lambda: render_slo_rules(slo_config, _fleet(args), args.period)}[args.which]()
    except OSError as exc:
        return fail(f"--slo-config {slo_config}: {exc.strerror}")
    except InputError as exc:
        return fail(exc)
    if args.check:
        try:
            current = Path(args.check).read_text(encoding="utf-8")
        except OSError as exc:
            return fail(f"--check {args.check}: {exc.strerror}")
        except UnicodeDecodeError:
            return fail(f"--check {args.check}: not a UTF-8 text file")
        if current != text:
            return fail(f"{args.check} is out of date; regenerate with `gpuobs rules render` (or `make rules`)",
                        EXIT_FAILURE)
        return 0
    sys.stdout.write(text)
    return 0


def _fleet(args: argparse.Namespace):
    from gpuobs.core.fleet import load_fleet, shipped_fleet

    return load_fleet(Path(args.fleet)) if args.fleet else shipped_fleet()


def _out_problem(args: argparse.Namespace, exc: OSError) -> str:
    """One line for an output tree that cannot take the files (nothing was written: core.files.write_tree)."""
    where = f"--out {args.out}" if args.out else "the output directory"
    return f"{where}: cannot write {exc.filename or ''}: {exc.strerror or exc}; nothing was written"


def _render(args: argparse.Namespace) -> int:
    from gpuobs.mixin.render import render

    if args.check not in (None, True):
        return fail("render: --check takes no file (it compares every file under --out)")
    try:
        written, stale = render(Path(args.fleet) if args.fleet else None, Path(args.out) if args.out else None,
                                check=bool(args.check),
                                slo_config=Path(args.slo_config) if args.slo_config else None)
    except InputError as exc:
        return fail(exc)
    except OSError as exc:
        return fail(_out_problem(args, exc))
    if stale:
        return fail("out of date (regenerate with `gpuobs rules render`"
                    + (f" --fleet {args.fleet}" if args.fleet else "") + (f" --out {args.out}" if args.out else "")
                    + f"): {', '.join(stale)}", EXIT_FAILURE)
    for path in written:
        print(path)
    return 0


def _dashboards(args: argparse.Namespace) -> int:
    from gpuobs.mixin.dashboards import write_dashboards

    out = Path(args.out) if args.out else None
    try:
        written, stale = write_dashboards(out, check=bool(args.check), cfg=_fleet(args))
    except InputError as exc:
        return fail(exc)
    except OSError as exc:
        return fail(_out_problem(args, exc))
    if stale:
        return fail(f"stale dashboards (regenerate with `gpuobs rules dashboards`): {', '.join(stale)}", EXIT_FAILURE)
    for path in written:
        print(path)
    return 0


def _kubernetes(args: argparse.Namespace) -> int:
    from gpuobs.canary.config import ConfigError, load_config
    from gpuobs.mixin.kubernetes import write

    try:
        cfg = load_config(None)  # the packaged metrics.yaml: the controller settings follow its timing
    except ConfigError as exc:
        return fail(str(exc))
    out = Path(args.out) if args.out else None
    try:
        fleet = _fleet(args)
    except InputError as exc:
        return fail(exc)
    try:
        written, stale = write(cfg.horizon_s, cfg.interval_s, fleet, out, check=bool(args.check))
    except OSError as exc:
        return fail(_out_problem(args, exc))
    if stale:
        return fail(f"stale Kubernetes manifests (regenerate with `gpuobs rules kubernetes`): {', '.join(stale)}",
                    EXIT_FAILURE)
    for path in written:
        print(path)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``rules`` group to ``sub``."""
    r = sub.add_parser("rules", help="generate the rule files, Alertmanager config and dashboards (the mixin)",
                       description="Generate everything gpuobs ships from the fleet config (prometheus/fleet.yaml "
                                   "or --fleet): the rule files, Alertmanager's config, the dashboards and the "
                                   "Kubernetes manifests; --check compares instead of writing.")
    r.add_argument("which", choices=["render", "xid", "kernel-log", "slo", "dashboards", "kubernetes"],
                   help="render: write every rule file, alertmanager/alertmanager.yml and the dashboards from "
                        "--fleet; xid/kernel-log/slo: print that rule file; dashboards: write grafana/dashboards/*.json; "
                        "kubernetes: write deploy/kubernetes/")
    r.add_argument("--fleet", default=None, metavar="FILE",
                   help="fleet config: identity label, selectors, signal paths, runbook base (default: the shipped "
                        "prometheus/fleet.yaml); render, xid, kernel-log, slo, dashboards and kubernetes follow it")
    r.add_argument("--slo-config", default=None, help="SLO definitions (default: the shipped prometheus/slo.yaml)")
    r.add_argument("--period", default=None, help="override the SLO period, e.g. 3d (for `slo`)")
    r.add_argument("--out", default=None,
                   help="render: output root; dashboards/kubernetes: output directory (default: the repository / "
                        "asset root for render, grafana/dashboards and deploy/kubernetes for the others)")
    r.add_argument("--check", nargs="?", const=True, metavar="FILE",
                   help="render/dashboards/kubernetes: exit 1 if a file is stale; xid/kernel-log/slo: exit 1 if FILE differs")
    r.set_defaults(func=cmd_rules)
