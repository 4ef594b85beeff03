"""``gpuobs upgrade run|status|abort|resume|pause|promote``: the driver fleet upgrade's command line.

A thin command over :class:`gpuobs.rollout.driver.DriverController` (the rollout controller with
batches stratified by GPU model, a verdict per model against each node's own history, and the
regressed model's rollback) on the native stack of ``--run-dir`` (``<run>/stack.json``): its
serving nodes through their admin API (:class:`gpuobs.rollout.adapters.drivers.StackDriverFleet`),
its Prometheus. The database is ``<run>/upgrade.sqlite``, one controller at a time holds
``<run>/upgrade.lock``. Exit codes as ``gpuobs rollout``: 0 Succeeded, 1 RolledBack / Rejected /
rollback incomplete, 3 Aborted, 2 usage or input error (one ``error:`` line on stderr). What this
group shares with ``gpuobs rollout`` and ``gpuobs flag`` is :mod:`gpuobs.cli.decide` (docs/upgrade.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuobs.cli import decide
from gpuobs.cli.common import fail
from gpuobs.core.fleet import FleetConfigError
from gpuobs.promapi.prometheus import PromClient
from gpuobs.reference.releases import load
from gpuobs.rollout.adapters.prometheus import analyzer_factory
from gpuobs.rollout.adapters.drivers import StackDriverFleet
from gpuobs.rollout.driver import (
    DriverController,
    check_models,
    check_target,
    driver_spec,
    parse_batches,
    short_model,
)
from gpuobs.rollout.interfaces import FleetError
from gpuobs.rollout.model import RolloutSpec, UsageError
from gpuobs.rollout.report import report
from gpuobs.stack.state import StackState
from gpuobs.stack.supervisor import load_state

RUN_EPILOG = """examples:
  gpuobs upgrade run --driver 570.172.08
  gpuobs upgrade run --driver 570.195.03 --batches canary,25%,50%,100% --interval 15s --batch-timeout 15m
  gpuobs upgrade run --driver 570.172.08 --exclude gpu-node-03   # an operator holds gpu-node-03
exit codes: 0 Succeeded, 1 RolledBack or Rejected, 3 Aborted (inconclusive, aborted, Prometheus errors), 2 usage"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``upgrade`` (``run``, ``status``, ``abort``, ``resume``, ``pause``, ``promote``); each leaf sets
    ``func(args) -> int``."""
    up = subparsers.add_parser("upgrade", help="driver fleet upgrade: stratified batches judged per GPU model, "
                                               "automatic rollback",
                               description="NVIDIA driver upgrade of the serving fleet: compatibility gate, batches "
                                           "stratified by GPU model (cordon, drain, install, health check, "
                                           "uncordon), each model's upgraded nodes judged against their own "
                                           "history, the regressed model rolled back (docs/upgrade.md).")
    sub = up.add_subparsers(dest="upgrade_command", metavar="{run,status,abort,resume,pause,promote}", required=True)
    common = decide.group_options()
    r = sub.add_parser("run", parents=[common], help="start a driver upgrade and drive it to the end",
                       epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--driver", required=True, help="target NVIDIA driver version, e.g. 570.172.08")
    r.add_argument("--batches", default="canary,25%,50%,100%",
                   help="cumulative node counts (1), shares (25%%) or 'canary' (one node of every GPU model) "
                        "(default canary,25%%,50%%,100%%)")
    r.add_argument("--exclude", default="", metavar="HOST,...",
                   help="serving nodes left out of the upgrade (kept on their driver, not in any batch nor in "
                        "the baseline): a node an operator holds (cordoned) stops the upgrade unless it is "
                        "uncordoned or left out here")
    r.add_argument("--interval", default="15s", help="analysis look interval (default 15s)")
    r.add_argument("--batch-timeout", dest="stage_timeout", default="15m",
                   help="analysis deadline per batch = analysis horizon (default 15m)")
    r.add_argument("--settle", default="15s", help="wait after a batch is back in service before its analysis "
                                                   "window opens (default 15s)")
    r.add_argument("--bake", default=None, help="SLO-page watch after the last batch (default: one interval)")
    r.add_argument("--error-limit", type=int, default=3, help="consecutive Prometheus errors before abort (3)")
    r.add_argument("--releases", default=None, metavar="FILE",
                   help="release catalogue the fleet's release is read from (default: the packaged one)")
    r.add_argument("--override-freeze", action="store_true", help="start/continue despite an exhausted error budget")
    r.add_argument("--reason", help="why the freeze is overridden (required with --override-freeze; recorded)")
    r.set_defaults(func=run_upgrade)
    decide.add_decision_commands(sub, common, DRIVER, run_status)


def _fleet(stack: StackState, flag: None = None) -> StackDriverFleet:
    """The driver upgrade's fleet: the stack's serving nodes (``flag`` is always None)."""
    return StackDriverFleet(stack)


DRIVER = decide.Driver(decide.UPGRADE, DriverController, _fleet,
                       options=lambda cfg: {"identity_label": cfg.identity_label})


def run_upgrade(args: argparse.Namespace) -> int:
    """Handler of ``upgrade run``."""
    return decide.start(DRIVER, args, _plan, "--driver")


def _plan(args: argparse.Namespace, interval: float) -> RolloutSpec:
    """``upgrade run``'s spec: driver ``--driver`` over the running stack's serving nodes, in
    ``--batches`` stratified by GPU model; the release the fleet runs from the catalogue (the
    compatibility gate re-checks it on the new driver). Every option is checked before the plan is
    printed. Raises UsageError (no running stack, another rollout unfinished, a driver not in the
    stack's driver catalogue or already on every node, nodes on different releases, a node an operator
    cordoned and ``--exclude`` does not leave out, a bad ``--exclude``, bad batches, a bad --prometheus URL), FleetError, CatalogueError, DriverCatalogueError, FleetConfigError, KeyError
    (a release not in the catalogue), ConfigError (a bad duration or --config)."""
    from gpuobs.reference.compat import CompatInputError, parse_driver
    from gpuobs.reference.drivers import load as load_drivers

    try:
        parse_driver(args.driver)
    except CompatInputError as err:
        raise UsageError(f"--driver: {err}") from None
    timing = decide.timings(args, interval, "--batch-timeout")
    decide.fleet_of(args)
    stack = decide.running_stack(args)
    try:  # what drive() builds from them, checked before anything is printed or written
        client = PromClient(args.prometheus or stack.urls.prometheus)
    except ValueError as exc:  # not an http(s) URL
        raise UsageError(f"--prometheus: {exc}") from None
    analyzer_factory(client, args.config)
    decide.refuse_other_unfinished(args.run_dir, decide.UPGRADE)  # again under the start lock in drive()
    fleet = StackDriverFleet(stack)
    left_out = excluded(args.exclude, fleet.hosts)
    serving = [h for h in fleet.hosts if h not in left_out]
    catalogue = load_drivers(Path(stack.drivers_file) if stack.drivers_file else None)
    check_target(args.driver, list(catalogue.drivers), {h: fleet.version(h) for h in serving})
    models = {h: fleet.model(h) for h in serving}
    check_models(models)
    held = {h: hold for h in serving if (hold := fleet.operator_hold(h, fleet.status(h)))}
    if held:  # the procedure would refuse them at their batch and abort the upgrade: say so now
        raise UsageError("; ".join(held.values()) + f": uncordon or leave out (--exclude {','.join(held)})")
    versions = {h: fleet_release(stack, h) for h in serving}
    if len(set(versions.values())) != 1:
        raise UsageError("the serving nodes run different releases (" + ", ".join(
            f"{h} {v}" for h, v in versions.items()) + "): finish that release rollout before a driver upgrade")
    try:
        release = load(Path(args.releases) if args.releases else None).get(next(iter(versions.values())))
    except KeyError as err:  # the fleet's release, not --driver, is missing from the release catalogue
        raise UsageError(f"--releases: the fleet's release: {err.args[0]}") from None
    hosts, counts = parse_batches(args.batches, models)
    print("upgrade plan: " + "; ".join(
        f"batch {i + 1}: " + ", ".join(f"{h} ({short_model(models[h])})" for h in hosts[lo:hi])
        for i, (lo, hi) in enumerate(zip([0, *counts[:-1]], counts)))
        + (f"; left out (--exclude): {', '.join(left_out)}" if left_out else ""), flush=True)
    return driver_spec(args.driver, release.engine, release.cuda, hosts, counts, release=release.version, **timing)


def excluded(spec: str, hosts: list[str]) -> list[str]:
    """The nodes of ``--exclude`` (comma-separated serving node names), in fleet order. Raises
    UsageError naming the flag: a name that is not a serving node (the message lists them), or every
    node left out."""
    names = [n.strip() for n in (spec or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in hosts]
    if unknown:
        raise UsageError(f"--exclude: {', '.join(repr(n) for n in unknown)} is not a serving node; "
                         f"serving nodes: {', '.join(hosts)}")
    if names and set(names) >= set(hosts):
        raise UsageError("--exclude leaves no serving node to upgrade")
    return [h for h in hosts if h in names]


def fleet_release(stack: StackState, host: str) -> str:
    """The release ``host`` runs (``GET /admin/deploy``). Raises FleetError."""
    from gpuobs.rollout.adapters.native import StackFleet

    return StackFleet(stack).version(host)


def run_status(args: argparse.Namespace) -> int:
    """Handler of ``upgrade status``: prints the report (0), or 2 when there is no driver upgrade."""
    try:
        with decide.open_store(args.run_dir, decide.UPGRADE) as store:
            stack = load_state(Path(args.run_dir))
            prometheus = args.prometheus or (stack.urls.prometheus if stack else None)
            rec = decide.pick(args, store, decide.UPGRADE)
            fleet = None
            if stack and stack.running and not args.json:
                try:
                    fleet = StackDriverFleet(stack)
                except FleetError:
                    fleet = None
            print(report(store, rec.id, fleet, args.json, prometheus, decide.UPGRADE.group,
                         decide.fleet_of(args).identity_label))
    except (UsageError, KeyError, FleetConfigError) as err:
        return fail(decide.problem(err))
    return 0
