"""``gpuobs rollout start|status|abort|resume|pause|promote``: the progressive rollout controller's command line.

Works on the native stack of ``--run-dir`` (``<run>/stack.json``: nodes, admin token, Prometheus URL);
the rollout database is ``<run>/rollout.sqlite`` and one controller at a time holds
``<run>/rollout.lock``. Progress goes to stdout, one line per event, then a report with the stage
table and the deciding canary verdict table. Exit codes (docs/rollout.md; see :mod:`gpuobs.rollout.controller`):
0 Succeeded, 1 RolledBack / Rejected / rollback incomplete, 3 Aborted (inconclusive, operator abort,
Prometheus errors, freeze mid-rollout), 2 usage or input error (one ``error:`` line on stderr).

``pause`` / ``promote`` record a human decision (operator name, reason) that the running controller
acts on at its next wait (:mod:`gpuobs.rollout.decisions`); ``resume`` lifts a pause and, when no
controller is running, drives the rollout on. Both exit 0 once recorded. What this group shares with
``gpuobs flag`` (options, the decision subcommands, driving the controller) is :mod:`gpuobs.cli.decide`;
the report is :func:`gpuobs.rollout.report.report`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuobs.cli import decide
from gpuobs.cli.common import fail
from gpuobs.reference.releases import load
from gpuobs.rollout.adapters.native import StackFleet
from gpuobs.rollout.controller import Controller
from gpuobs.rollout.model import RolloutSpec, UsageError, parse_stages
from gpuobs.rollout.report import report
from gpuobs.stack.state import StackState
from gpuobs.stack.supervisor import load_state

START_EPILOG = """examples:
  gpuobs rollout start --version 1.5.0 --stages 1,50%,100% --interval 15s --stage-timeout 4m
  gpuobs rollout start --version 1.6.0 --override-freeze --reason "INC-123 hotfix, approved by SRE on call"
exit codes: 0 Succeeded, 1 RolledBack or Rejected, 3 Aborted (inconclusive, aborted, Prometheus errors), 2 usage"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``rollout`` (``start``, ``status``, ``abort``, ``resume``, ``pause``, ``promote``); each leaf sets
    ``func(args) -> int``."""
    ro = subparsers.add_parser("rollout", help="progressive rollout with gates, canary analysis and rollback",
                               description="Compatibility gate, error-budget gate, canary stages by node share "
                                           "analysed over Prometheus, automatic rollback (docs/rollout.md).")
    sub = ro.add_subparsers(dest="rollout_command", metavar="{start,status,abort,resume,pause,promote}",
                            required=True)
    common = decide.group_options()
    s = sub.add_parser("start", parents=[common], help="start a rollout and drive it to the end", epilog=START_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--version", required=True, help="release version from the catalogue, e.g. 1.5.0")
    decide.add_drive_options(s, bake_help="SLO-page watch after deploying 100%% (default: one interval)")
    s.set_defaults(func=run_start)
    decide.add_decision_commands(sub, common, DRIVER, run_status)


def _fleet(stack: StackState, flag: None = None) -> StackFleet:
    """The release rollout's fleet: the stack's serving nodes (``flag`` is always None)."""
    return StackFleet(stack)


DRIVER = decide.Driver(decide.RELEASE, Controller, _fleet)


def run_start(args: argparse.Namespace) -> int:
    """Handler of ``rollout start``."""
    return decide.start(DRIVER, args, _plan, "--version")


def _plan(args: argparse.Namespace, interval: float) -> RolloutSpec:
    """``rollout start``'s spec: release ``--version`` from the catalogue over the running stack's
    serving nodes in ``--stages``. Raises UsageError (no running stack, a flag rollout unfinished,
    bad stages), CatalogueError, KeyError (no such version), ConfigError (a bad duration)."""
    release = load(Path(args.releases) if args.releases else None).get(args.version)
    stack = decide.running_stack(args)
    decide.refuse_other_unfinished(args.run_dir, decide.RELEASE)  # again under the start lock in drive()
    hosts = StackFleet(stack).hosts
    return RolloutSpec(release.version, release.engine, release.cuda, tuple(hosts),
                       tuple(parse_stages(args.stages, len(hosts))), **decide.timings(args, interval))


def run_status(args: argparse.Namespace) -> int:
    """Handler of ``rollout status``: prints the report (0), or 2 when there is no rollout."""
    try:
        with decide.open_store(args.run_dir, decide.RELEASE) as store:
            stack = load_state(Path(args.run_dir))
            prometheus = args.prometheus or (stack.urls.prometheus if stack else None)
            rec = decide.pick(args, store)
            print(report(store, rec.id, None, args.json, prometheus))
            if stack and stack.running and not args.json:
                from gpuobs.rollout.drift import drift

                lines = drift(rec, StackFleet(stack).version)
                if lines:
                    print(f"WARNING: the fleet no longer matches rollout {rec.id} ({rec.state} {rec.version}); "
                          "was the stack restarted?", flush=True)
                    for line in lines:
                        print(f"  {line}", flush=True)
    except (UsageError, KeyError) as err:
        return fail(decide.problem(err))
    return 0
