"""``gpuobs compat``: the compatibility gate's command line (``check``, ``fleet``, ``plan-driver-upgrade``).

The main CLI calls :func:`register` with its sub-parsers object, then ``args.func(args)`` and
exits with the returned code: 0 compatible (warnings included) or plan OK, 1 incompatible or
plan blocked, 2 bad input (one ``error:`` line on stderr naming the field, the value and what is
accepted; :mod:`gpuobs.core.errors`). Results go to stdout, as text or, with ``--json``, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from gpuobs.cli.common import fail, fleet_config, pos_float  # noqa: E402
from gpuobs.compat.inventory import inventory, judge_fleet
from gpuobs.compat.gate import (
    COMPATIBLE_WITH_WARNINGS,
    DRIVER_BRANCHES,
    FAIL,
    INCOMPATIBLE,
    WARN,
    CompatInputError,
    Verdict,
    check,
)
from gpuobs.compat.upgrade_plan import UpgradePlan, load_inventory, plan_driver_upgrade
from gpuobs.core.errors import EXIT_USAGE as EXIT_BAD_INPUT  # noqa: E402
from gpuobs.core.errors import InputError
from gpuobs.core.fleet import check_label_name, parse_matchers
from gpuobs.promapi.prometheus import PromClient, PrometheusError
from gpuobs.reference.compat import parse_driver
from gpuobs.reference.releases import CatalogueError, load

CHECK_EPILOG = """examples:
  gpuobs compat check --driver 535.104.05 --gpu "NVIDIA H100 80GB HBM3" --cuda 12.4 --engine vllm==0.6.3
  gpuobs compat check --driver 570.124.06 --gpu sm_90 --cuda 13.0 --cuda-compat --json
exit codes: 0 COMPATIBLE or COMPATIBLE_WITH_WARNINGS, 1 INCOMPATIBLE, 2 bad input"""

PLAN_EPILOG = """example:
  gpuobs compat plan-driver-upgrade --to 580.95.05 --max-unavailable 1 --inventory fleet.yaml
exit codes: 0 every release stays compatible, 1 something would be incompatible, 2 bad input"""


FLEET_EPILOG = """example:
  gpuobs compat fleet --prometheus http://127.0.0.1:9090 --release 2.0.0
exit codes: 0 every node compatible (warnings included), 1 a node incompatible, unjudgeable or
            missing, or Prometheus unreachable; 2 bad input (unknown release, bad flag, rejected query)"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``compat`` (with ``check``, ``fleet`` and ``plan-driver-upgrade``) to ``subparsers``.

    Each leaf sets ``func``: ``func(args: argparse.Namespace) -> int`` (exit code 0/1/2).
    """
    compat = subparsers.add_parser(
        "compat", help="driver / CUDA build / GPU / engine compatibility gate",
        description="Judge driver x GPU x CUDA build x engine combinations against the reference tables "
                    "(CUDA release notes, NVIDIA architecture matrix, engine release matrices).")
    sub = compat.add_subparsers(dest="compat_command", metavar="{check,fleet,plan-driver-upgrade}", required=True)

    c = sub.add_parser("check", help="judge one release on one GPU and driver", epilog=CHECK_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="One verdict line, then one line per rule with the data row's source.")
    c.add_argument("--driver", required=True, help="Linux driver version, e.g. 535.104.05 (DCGM_FI_DRIVER_VERSION)")
    c.add_argument("--gpu", required=True,
                   help="DCGM modelName ('NVIDIA H100 80GB HBM3'), sm target (sm_90), compute capability (9.0) "
                        "or architecture (Hopper)")
    c.add_argument("--cuda", required=True, help="CUDA version the release is built with, e.g. 12.4 or 12.4.1")
    c.add_argument("--engine", help="serving/training engine release, e.g. vllm==0.6.3, pytorch==2.7")
    c.add_argument("--ptx-jit", action="store_true",
                   help="the release JIT-compiles PTX or uses APIs that need the toolkit's own driver minimum")
    c.add_argument("--cuda-compat", action="store_true",
                   help="the release ships the cuda-compat package (forward compatibility)")
    c.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    c.set_defaults(func=run_check)
    add_fleet_parser(sub)

    inventory = os.environ.get("GPUOBS_INVENTORY")
    p = sub.add_parser("plan-driver-upgrade", help="plan a batched driver upgrade and check every release",
                       epilog=PLAN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Canary node first, then batches of at most --max-unavailable nodes, each with "
                                   "drain / upgrade / health-check / uncordon gates; every release re-checked on "
                                   "the target driver.")
    p.add_argument("--to", required=True, metavar="DRIVER", help="target driver version, e.g. 580.95.05")
    p.add_argument("--max-unavailable", default="1", metavar="N", help="nodes upgraded at once (default 1)")
    p.add_argument("--inventory", default=inventory, required=inventory is None, metavar="FILE",
                   help="YAML or JSON inventory of nodes and their releases (env GPUOBS_INVENTORY)")
    p.add_argument("--release", action="extend", nargs="+", metavar="NAME",
                   help="only check these releases (repeatable; default: all)")
    p.add_argument("--canary", metavar="HOSTNAME", help="node to upgrade first (default: the least loaded)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run_plan)


def _error(command: str, err: Exception) -> int:
    return fail(f"{command}: {err}", EXIT_BAD_INPUT)


def format_verdict(verdict: Verdict) -> str:
    """Text form of a verdict: a header line, then ``STATUS rule: message [source: ...]`` lines."""
    i = verdict.inputs
    engine = f", {i['engine']}" if i.get("engine") else ""
    head = (f"{verdict.verdict}: CUDA {i['cuda']} ({i['cuda_release']}){engine} on driver {i['driver']}, "
            f"{i['gpu_resolved']}")
    lines = [head] + [f"  {r.status.upper():4} {r.rule}: {r.message} [source: {r.source}]" for r in verdict.rules]
    return "\n".join(lines)


def run_check(args: argparse.Namespace) -> int:
    """Handler of ``compat check``: prints the verdict; returns 0, 1, or 2 on bad input."""
    try:
        verdict = check(args.driver, args.gpu, args.cuda, args.engine, ptx_jit=args.ptx_jit,
                        cuda_compat=args.cuda_compat)
    except CompatInputError as err:
        return _error("check", err)
    print(json.dumps(verdict.to_dict()) if args.json else format_verdict(verdict))
    return verdict.exit_code


def format_plan(plan: UpgradePlan) -> str:
    """Text form of an upgrade plan: header, skipped nodes, batches with gates, checks, result."""
    branch = DRIVER_BRANCHES.get(plan.target.branch)
    label = f"R{plan.target.branch}" + (f" {branch[0]}" if branch else "")
    nodes = sum(len(b.hosts) for b in plan.batches)
    out = [f"Driver upgrade to {plan.target} ({label}): {nodes} node(s) in {len(plan.batches)} batch(es), "
           f"at most {plan.max_unavailable} unavailable at a time; {len(plan.skipped)} skipped"]
    out += [f"  skip {host}: {why}" for host, why in plan.skipped]
    for b in plan.batches:
        out.append(f"Batch {b.index}{' (canary)' if b.canary else ''}: {', '.join(b.hosts)}")
        out += [f"  {n}. {g.gate}: {g.action}" for n, g in enumerate(b.gates, 1)]
    out.append(f"Compatibility on {plan.target} (current -> target driver):")
    for host, rule in plan.gpu_checks.items():
        out.append(f"  {rule.status.upper():4} {host} GPU {rule.rule}: {rule.message} [source: {rule.source}]")
        for c in (c for c in plan.checks if c.hostname == host):
            status = {INCOMPATIBLE: "FAIL", COMPATIBLE_WITH_WARNINGS: "WARN"}.get(c.after.verdict, "OK")
            out.append(f"  {status:4} {host} {c.release.describe()}: {c.before.verdict} -> {c.after.verdict} "
                       f"({c.change})")
            out += [f"         {r.status} {r.rule}: {r.message} [source: {r.source}]"
                    for r in c.after.rules if r.status == FAIL]
            warned = [r.rule for r in c.after.rules if r.status == WARN]
            if warned and c.after.verdict != INCOMPATIBLE:
                out.append(f"         warnings: {', '.join(warned)} (run compat check for details)")
    if not plan.batches:
        out.append("  nothing to upgrade")
    blockers = plan.blockers
    out.append(f"Result: BLOCKED, {len(blockers)} blocker(s): " + "; ".join(blockers) if blockers
               else "Result: OK, every checked release stays compatible on the target driver")
    return "\n".join(out)


def run_plan(args: argparse.Namespace) -> int:
    """Handler of ``compat plan-driver-upgrade``: prints the plan; returns 0, 1, or 2 on bad input."""
    try:
        raw = str(args.max_unavailable).strip()
        if not raw.isdigit() or int(raw) < 1:
            raise CompatInputError("--max-unavailable", args.max_unavailable, "not a positive integer", "1, 2, 3 ...")
        target = parse_driver(args.to, "--to")
        nodes = load_inventory(args.inventory)
        plan = plan_driver_upgrade(nodes, target, int(raw), args.release, args.canary)
    except CompatInputError as err:
        return _error("plan-driver-upgrade", err)
    print(json.dumps(plan.to_dict()) if args.json else format_plan(plan))
    return plan.exit_code


def add_fleet_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``fleet`` to the ``compat`` sub-parsers; its ``func`` returns the exit code."""
    f = sub.add_parser("fleet", help="judge a catalogue release on every node found in Prometheus",
                       epilog=FLEET_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Inventory from dcgm-exporter's labels (modelName, DCGM_FI_DRIVER_VERSION) per "
                                   "node (the fleet config's identity label) in Prometheus; one verdict per node.")
    f.add_argument("--prometheus", default=os.environ.get("GPUOBS_PROMETHEUS_URL", "http://127.0.0.1:9090"),
                   metavar="URL", help="Prometheus-API base URL (env GPUOBS_PROMETHEUS_URL)")
    f.add_argument("--release", required=True, metavar="NAME", help="release version in the catalogue, e.g. 1.5.0")
    f.add_argument("--releases", default=os.environ.get("GPUOBS_RELEASES"), metavar="FILE",
                   help="release catalogue YAML (env GPUOBS_RELEASES; default: the packaged one)")
    f.add_argument("--fleet", default=os.environ.get("GPUOBS_FLEET_CONFIG"), metavar="FILE",
                   help="fleet config the rules were rendered from (format of prometheus/fleet.yaml; env "
                        "GPUOBS_FLEET_CONFIG): its DCGM selector and identity label (default: the default config's)")
    f.add_argument("--selector", default=None, metavar="MATCHERS",
                   help="label matchers of the inventory series, e.g. 'job=\"dcgm\"' (default: the fleet config's "
                        "DCGM selector)")
    f.add_argument("--identity-label", "--hostname-label", default=None, metavar="LABEL",
                   help="the label that names a node (default: the fleet config's identity label; "
                        "--hostname-label is its older spelling, which defaulted to dcgm-exporter's Hostname)")
    f.add_argument("--timeout", type=pos_float, default=10.0, metavar="S", help="per-request timeout, s (default 10)")
    f.add_argument("--retries", type=int, default=3, metavar="N",
                   help="retries on connection errors and 5xx, exponential backoff (default 3)")
    f.add_argument("--ptx-jit", action="store_true", help="the release JIT-compiles PTX")
    f.add_argument("--cuda-compat", action="store_true", help="the release ships the cuda-compat package")
    f.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    f.set_defaults(func=run_fleet)


def run_fleet(args: argparse.Namespace) -> int:
    """Handler of ``compat fleet``: prints the per-node table; returns 0, 1 or 2."""
    try:
        release = load(args.releases).get(args.release)
        client = PromClient(args.prometheus, timeout=args.timeout, retries=max(0, args.retries))
    except (CatalogueError, KeyError, OSError, ValueError) as err:
        msg = err.args[0] if isinstance(err, KeyError) else err  # KeyError's str() adds quotes
        return fail(f"fleet: --release/--releases/--prometheus: {msg}", EXIT_BAD_INPUT)
    try:  # FleetConfigError and a bad --identity-label are input errors: one line, exit 2
        fleet = fleet_config(args.fleet)
        ident = check_label_name(fleet.identity_label if args.identity_label is None else args.identity_label,
                                 "--identity-label")
        selector = fleet.dcgm_selector if args.selector is None else ",".join(parse_matchers(args.selector, "--selector"))
    except InputError as err:
        return fail(f"fleet: {err}", EXIT_BAD_INPUT)
    try:
        rows = inventory(client, selector, ident)
    except PrometheusError as err:  # a rejected query is the user's (2), an unreachable backend a failure (1)
        return fail(f"fleet: {err}", err.exit_code)
    report = judge_fleet(rows, release, ptx_jit=args.ptx_jit, cuda_compat=args.cuda_compat)
    print(json.dumps(report.to_dict()) if args.json else report.table())
    return report.exit_code
