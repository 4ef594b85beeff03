"""``gpuobs flag rollout|status|abort|resume|pause|promote|kill``: feature flags as a release unit, with a kill switch.

Works on the native stack of ``--run-dir`` like ``gpuobs rollout`` (docs/rollout.md "Feature flags"):
the flag file is ``<run>/flags.json`` (flagd format; the engines evaluate it through OpenFeature), the
flag rollout database ``<run>/flag.sqlite`` and one flag controller at a time holds ``<run>/flag.lock``.
A flag rollout and a release rollout never run at once (both relabel the canary cohort): each refuses
to start while the other has an unfinished rollout. Exit codes as ``gpuobs rollout``: 0 Succeeded
(flag on everywhere), 1 RolledBack / Rejected / rollback incomplete, 3 Aborted, 2 usage or input
error; ``kill`` exits 0 once the flag file says off everywhere. ``pause`` / ``promote`` record a human
decision in the flag store exactly as ``gpuobs rollout pause|promote`` do (:mod:`gpuobs.rollout.decisions`).
What this group shares with ``gpuobs rollout`` is :mod:`gpuobs.cli.decide`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpuobs.core.durations import parse_duration
from gpuobs.core.errors import ConfigError
from gpuobs.cli import decide
from gpuobs.cli.common import fail
from gpuobs.flags.flagd import FILE_NAME, FlagFile, FlagFileError
from gpuobs.reference.releases import load
from gpuobs.rollout.adapters.flags import StackFlagFleet
from gpuobs.rollout.flag import FlagController, flag_spec, parse_variant
from gpuobs.rollout.interfaces import FleetError
from gpuobs.rollout.model import TERMINAL, RolloutSpec, UsageError, parse_stages
from gpuobs.rollout.report import report
from gpuobs.rollout.store import RolloutStore
from gpuobs.stack.supervisor import load_state

DB = decide.FLAG.db
ROLLOUT_EPILOG = """examples:
  gpuobs flag rollout kv_policy_v2 --stages 1,50%,100% --interval 15s --stage-timeout 6m
  gpuobs flag kill spec_decode --reason "INC-77: errors on long prompts"
exit codes: 0 Succeeded (on everywhere), 1 RolledBack or Rejected (off everywhere), 3 Aborted, 2 usage"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``flag`` (``rollout``, ``status``, ``abort``, ``resume``, ``pause``, ``promote``, ``kill``)."""
    fl = subparsers.add_parser("flag", help="feature-flag rollouts judged by the canary, with a kill switch",
                               description="Progressive enablement of a feature flag by node share, each stage "
                                           "judged by the canary analyzer (flag on vs off), error-budget gates, "
                                           "and a kill switch (docs/rollout.md, Feature flags).")
    sub = fl.add_subparsers(dest="flag_command", metavar="{rollout,status,abort,resume,pause,promote,kill}",
                            required=True)
    common = decide.group_options()
    r = sub.add_parser("rollout", parents=[common], help="turn a flag on progressively and drive it to the end",
                       epilog=ROLLOUT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("name", metavar="NAME", help="flag key from the release catalogue, e.g. spec_decode")
    decide.add_drive_options(r, bake_help="SLO-page watch after 100%% (default: one interval)")
    r.set_defaults(func=run_rollout)
    decide.add_decision_commands(sub, common, DRIVER, run_status)
    k = sub.add_parser("kill", parents=[common], help="kill switch: NAME off on every node now, in one write")
    k.add_argument("name", metavar="NAME", help="flag key")
    k.add_argument("--reason", default="killed from the command line", help="recorded reason")
    k.add_argument("--wait", default="120s", help="how long to wait for a running flag controller to roll back")
    k.set_defaults(func=run_kill)


DRIVER = decide.Driver(decide.FLAG, FlagController, StackFlagFleet)


def run_rollout(args: argparse.Namespace) -> int:
    """Handler of ``flag rollout NAME``."""
    return decide.start(DRIVER, args, _plan, "NAME")


def _plan(args: argparse.Namespace, interval: float) -> RolloutSpec:
    """``flag rollout NAME``'s spec: flag NAME from the catalogue on over the running stack's serving
    nodes in ``--stages``, the nodes it is already on first (the first stage must cover them).
    Raises UsageError (no running stack, a release rollout unfinished, bad stages), CatalogueError,
    KeyError (no such flag), ConfigError (a bad duration), FleetError, OSError (the flag file)."""
    flag = load(Path(args.releases) if args.releases else None).flag(args.name).name
    stack = decide.running_stack(args)
    decide.refuse_other_unfinished(args.run_dir, decide.FLAG)  # again under the start lock in drive()
    fleet = StackFlagFleet(stack, flag)
    on = [h for h in fleet.hosts if fleet.version(h).endswith("=on")]
    hosts = on + [h for h in fleet.hosts if h not in on]  # nodes already on form the first canary
    stages = parse_stages(args.stages, len(hosts))
    if len(on) > stages[0]:
        raise UsageError(f"{flag} is already on for {len(on)} node(s) ({', '.join(on)}); the first stage "
                         f"({stages[0]}) must cover them, or `gpuobs flag kill {flag}` first")
    return flag_spec(flag, tuple(hosts), tuple(stages), **decide.timings(args, interval))


def run_kill(args: argparse.Namespace) -> int:
    """Handler of ``flag kill NAME``: the flag off on every node in one write of the flag file (no
    Prometheus needed), the engines' confirmation, then the active rollout of it (if any) aborted."""
    try:
        wait_s = parse_duration(args.wait, "--wait")
        stack = decide.running_stack(args)
        fleet = StackFlagFleet(stack, args.name)
        t0 = time.monotonic()
        was_on, unconfirmed = fleet.kill(f"gpuobs flag kill: {args.reason}")
        took = time.monotonic() - t0
    except (UsageError, ConfigError, FleetError) as err:
        return fail(err)
    print(f"kill switch: {args.name} off on every node in {fleet.file.path} (was on for "
          f"{', '.join(was_on) or 'none'}); " + (f"every engine confirmed off in {took:.2f}s" if not unconfirmed
                                                  else "not confirmed by " + "; ".join(unconfirmed)), flush=True)
    path = Path(args.run_dir) / DB
    if not path.exists():
        return 0
    store = RolloutStore(path)
    try:
        rec = store.latest(active_only=True, terminal=TERMINAL)
        if rec is None or parse_variant(rec.version)[0] != args.name:
            return 0
        code = decide.ask_controller(args, decide.FLAG, store, rec.id, f"kill switch: {args.reason}", wait_s)
    finally:
        store.close()
    if code is not None:
        return 0
    rc = decide.drive(DRIVER, args, lambda ctl, rid: ctl.abort(rid, f"kill switch: {args.reason}"), rid=rec.id)
    return 0 if rc in (0, 3) else rc


def run_status(args: argparse.Namespace) -> int:
    """Handler of ``flag status``: the latest flag rollout's report and, with a stack, where each flag is on."""
    stack = load_state(Path(args.run_dir))
    prometheus = args.prometheus or (stack.urls.prometheus if stack else None)
    printed = False
    path = Path(args.run_dir) / DB
    if path.exists() or args.id:
        try:
            with decide.open_store(args.run_dir, decide.FLAG) as store:
                rec = decide.pick(args, store, decide.FLAG)
                print(report(store, rec.id, None, args.json, prometheus, group="flag"))
                printed = True
        except (UsageError, KeyError) as err:
            return fail(decide.problem(err))
    if args.json:
        return 0 if printed else fail(f"no flag rollout recorded in {args.run_dir}")
    ff = FlagFile(Path(args.run_dir) / FILE_NAME)
    try:
        doc = ff.read()
    except FlagFileError as err:
        if not printed:
            return fail(err)
        return 0
    hosts = list(stack.serving_hosts) if stack else []
    print(f"flags in {ff.path}:")
    for name, spec in doc["flags"].items():
        meta = spec.get("metadata") or {}
        try:
            on = ff.hosts(name)
        except FlagFileError as err:
            print(f"  {name}: {err}")
            continue
        share = f"{len([h for h in on if h in hosts])}/{len(hosts)} serving nodes" if hosts else f"{len(on)} node(s)"
        print(f"  {name}: on for {share}" + (f" ({', '.join(on)})" if on else "")
              + (f"; KILLED: {meta.get('reason')}" if meta.get("killed") else ""))
    return 0
