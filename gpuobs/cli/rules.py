"""``gpuobs rules``: the generated artefacts of :mod:`gpuobs.mixin` (Xid rules, SLO rules, dashboards)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuobs.cli.common import fail
from gpuobs.core import assets
from gpuobs.core.errors import EXIT_FAILURE


def cmd_rules(args: argparse.Namespace) -> int:
    """Print (or ``--check``) the Xid or SLO rule file; write (or ``--check``) the dashboards."""
    if args.which == "dashboards":
        return _dashboards(args)
    if args.which == "kubernetes":
        return _kubernetes(args)
    from gpuobs.mixin.kernel_log_rules import render as render_kernel_log_rules
    from gpuobs.mixin.slo_rules import render_slo_rules
    from gpuobs.mixin.xid_rules import render_xid_rules

    slo_config = Path(args.slo_config) if args.slo_config else assets.path("prometheus/slo.yaml")
    try:
        text = {"xid": render_xid_rules, "kernel-log": render_kernel_log_rules,
                "slo": lambda: render_slo_rules(slo_config, args.period)}[args.which]()
    except OSError as exc:
        return fail(f"--slo-config {slo_config}: {exc.strerror}")
    if args.check:
        try:
            current = Path(args.check).read_text()
        except OSError as exc:
            return fail(f"--check {args.check}: {exc.strerror}")
        if current != text:
            return fail(f"{args.check} is out of date; regenerate with `gpuobs rules {args.which} > {args.check}` "
                        "(or `make rules`)", EXIT_FAILURE)
        return 0
    sys.stdout.write(text)
    return 0


def _dashboards(args: argparse.Namespace) -> int:
    from gpuobs.mixin.dashboards import write_dashboards

    out = Path(args.out) if args.out else None
    written, stale = write_dashboards(out, check=bool(args.check))
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
    written, stale = write(cfg.horizon_s, cfg.interval_s, out, check=bool(args.check))
    if stale:
        return fail(f"stale Kubernetes manifests (regenerate with `gpuobs rules kubernetes`): {', '.join(stale)}",
                    EXIT_FAILURE)
    for path in written:
        print(path)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``rules`` group to ``sub``."""
    r = sub.add_parser("rules", help="generate rule files and dashboards derived from reference data",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("which", choices=["xid", "kernel-log", "slo", "dashboards", "kubernetes"],
                   help="xid/kernel-log/slo: print the rule file; dashboards: write grafana/dashboards/*.json; "
                        "kubernetes: write deploy/kubernetes/")
    r.add_argument("--slo-config", default=None, help="SLO definitions for `slo` (default: the shipped prometheus/slo.yaml)")
    r.add_argument("--period", default=None, help="override the SLO period, e.g. 3d (for `slo`)")
    r.add_argument("--out", default=None,
                   help="dashboards/kubernetes: output directory (default: grafana/dashboards, deploy/kubernetes)")
    r.add_argument("--check", nargs="?", const=True, metavar="FILE",
                   help="xid/slo: exit 1 if FILE differs from the generated text; "
                        "dashboards/kubernetes: exit 1 if a file is stale")
    r.set_defaults(func=cmd_rules)
