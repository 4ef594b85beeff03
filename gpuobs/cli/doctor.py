"""``gpuobs doctor``: which alert families work on this Prometheus (live / degraded / blind), why, and the fix.

Exit codes: 0 no paging family is blind (degraded ones included), 1 a paging family is blind or
Prometheus cannot be reached, 2 bad input (flag, selector, label name, a query the server rejects).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuobs.cli.common import env, fleet_config, pos_float
from gpuobs.core.fleet import FleetConfig
from gpuobs.doctor import render, run
from gpuobs.mixin.families import FAMILIES

DEFAULT = FleetConfig()

EPILOG = f"""examples:
  gpuobs doctor --prometheus http://127.0.0.1:9090
  gpuobs doctor --prometheus http://prometheus.monitoring:9090 --dcgm-selector 'job="nvidia-dcgm-exporter"' --json
families: {', '.join(f.name for f in FAMILIES)}
exit codes: 0 no paging family is blind, 1 a paging family is blind or Prometheus is unreachable, 2 bad input"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``doctor`` to ``subparsers``; its ``func(args) -> int`` is :func:`cmd_doctor`."""
    p = subparsers.add_parser(
        "doctor", help="check a live Prometheus: which alert families are live, degraded or blind, and the fix",
        description="Read a live Prometheus (any Prometheus-API backend; instant queries only) and print, per alert "
                    "family, live / degraded / blind, why (missing series, identity label, host labels, selectors, "
                    "driver label, MIG) and the exact fix (counters-CSV lines, relabel snippets).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prometheus", default=env("PROMETHEUS_URL"), required=env("PROMETHEUS_URL") is None,
                   help="base URL of the Prometheus API, e.g. http://127.0.0.1:9090 (env GPUOBS_PROMETHEUS_URL)")
    p.add_argument("--fleet", default=env("FLEET_CONFIG"), metavar="FILE",
                   help="take the selectors and the identity label from this fleet config (the one the rules were "
                        "rendered from, format of prometheus/fleet.yaml; env GPUOBS_FLEET_CONFIG); the flags below "
                        "override it")
    p.add_argument("--dcgm-selector", default=None,
                   help=f"label matchers of the dcgm-exporter targets (default {DEFAULT.dcgm_selector}, the fleet "
                        "config's default)")
    p.add_argument("--vllm-selector", default=None,
                   help=f"label matchers of the vLLM engine targets (default {DEFAULT.vllm_selector})")
    p.add_argument("--identity-label", default=None,
                   help=f"the node-identity label rules and dashboards group by (default {DEFAULT.identity_label})")
    p.add_argument("--skip", action="append", default=[], metavar="FAMILY[,FAMILY]",
                   help="families this fleet does not run (e.g. kv-cache,slo on a training-only fleet); "
                        "reported as skipped, left out of the exit code")
    p.add_argument("--timeout", type=pos_float, default=10.0, help="seconds per HTTP request (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--no-fixes", action="store_true", help="text output without the fix snippets")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run the checks and print the report; returns the exit code (errors raise and the CLI maps them)."""
    fleet = fleet_config(args.fleet)  # FleetConfigError is an InputError: the CLI prints it in one line, exit 2
    report = run(args.prometheus, fleet, identity_label=args.identity_label, dcgm_selector=args.dcgm_selector,
                 vllm_selector=args.vllm_selector, skip=args.skip, timeout=args.timeout)
    print(render.as_json(report) if args.json else render.text(report, fixes=not args.no_fixes), end="")
    return report.exit_code
