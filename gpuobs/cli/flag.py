"""``gpuobs flag rollout|status|abort|resume|pause|promote|kill``: feature flags as a release unit, with a kill switch.

Works on the native stack of ``--run-dir`` like ``gpuobs rollout`` (docs/rollout.md "Feature flags"):
the flag file is ``<run>/flags.json`` (flagd format; the engines evaluate it through OpenFeature), the
flag rollout database ``<run>/flag.sqlite`` and one flag controller at a time holds ``<run>/flag.lock``.
A flag rollout and a release rollout never run at once (both relabel the canary cohort): each refuses
to start while the other has an unfinished rollout. Exit codes as ``gpuobs rollout``: 0 Succeeded
(flag on everywhere), 1 RolledBack / Rejected / rollback incomplete, 3 Aborted, 2 usage or input
error; ``kill`` exits 0 once the flag file says off everywhere. ``pause`` / ``promote`` record a human
decision in the flag store exactly as ``gpuobs rollout pause|promote`` do (:mod:`gpuobs.rollout.decisions`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from gpuobs.canary.config import ConfigError, parse_duration
from gpuobs.cli import decide
from gpuobs.cli.common import env as _env
from gpuobs.cli.common import fail
from gpuobs.core import activity
from gpuobs.flags.flagd import FILE_NAME, FlagFile, FlagFileError
from gpuobs.promapi.prometheus import PromClient
from gpuobs.reference.releases import CatalogueError, load
from gpuobs.rollout import decisions, tracing
from gpuobs.rollout.adapters.flags import StackFlagFleet
from gpuobs.rollout.adapters.prometheus import PromSignals, analyzer_factory
from gpuobs.rollout.flag import FlagController, flag_spec, parse_variant
from gpuobs.rollout.interfaces import FleetError
from gpuobs.rollout.model import EXIT_CODES, TERMINAL, UsageError, parse_stages
from gpuobs.rollout.notices import send as send_notice
from gpuobs.rollout.report import report
from gpuobs.rollout.store import RolloutStore, RunLock
from gpuobs.stack.supervisor import load_state

DB, LOCK = decide.FLAG.db, decide.FLAG.lock
SERVICE_NAME = "gpuobs-flag-rollout"
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
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--run-dir", default=_env("RUN_DIR", ".run"), help="stack run directory (env GPUOBS_RUN_DIR)")
    common.add_argument("--prometheus", default=_env("PROMETHEUS_URL"), metavar="URL",
                        help="Prometheus URL (env GPUOBS_PROMETHEUS_URL; default: the stack's)")
    common.add_argument("--config", default=_env("CANARY_CONFIG"), metavar="FILE",
                        help="canary metrics YAML (env GPUOBS_CANARY_CONFIG; default: packaged metrics.yaml)")
    common.add_argument("--json", action="store_true", help="final report as one JSON object")
    r = sub.add_parser("rollout", parents=[common], help="turn a flag on progressively and drive it to the end",
                       epilog=ROLLOUT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("name", metavar="NAME", help="flag key from the release catalogue, e.g. spec_decode")
    r.add_argument("--stages", default="1,25%,50%,100%",
                   help="cumulative node counts (1) or shares (25%%) of the serving nodes (default 1,25%%,50%%,100%%)")
    r.add_argument("--interval", default="30s", help="analysis look interval (default 30s)")
    r.add_argument("--stage-timeout", default="5m", help="analysis deadline per canary stage = analysis horizon (5m)")
    r.add_argument("--settle", default="10s", help="wait after relabelling before the analysis window opens (10s)")
    r.add_argument("--bake", default=None, help="SLO-page watch after 100%% (default: one interval)")
    r.add_argument("--error-limit", type=int, default=3, help="consecutive Prometheus errors before abort (3)")
    r.add_argument("--releases", default=_env("RELEASES"), metavar="FILE", help="release catalogue (env GPUOBS_RELEASES)")
    r.add_argument("--override-freeze", action="store_true", help="start/continue despite an exhausted error budget")
    r.add_argument("--reason", help="why the freeze is overridden (required with --override-freeze; recorded)")
    r.set_defaults(func=run_rollout)
    for name, helptext in (("status", "show the latest (or --id) flag rollout and where each flag is on"),
                           ("resume", "lift a pause; continue an unfinished flag rollout from its persisted state"),
                           ("abort", "abort the active flag rollout: kill switch, flag off everywhere"),
                           ("pause", "hold the flag rollout for a human decision (no look acted on, no stage advance)"),
                           ("promote", "pass the current stage now, whatever the analysis says (recorded)")):
        p = sub.add_parser(name, parents=[common], help=helptext)
        p.add_argument("--id", help="flag rollout id (default: the latest)")
        if name == "abort":
            p.add_argument("--reason", default="aborted from the command line", help="recorded abort reason")
            p.add_argument("--wait", default="120s", help="how long to wait for a running controller to finish")
        if name in ("pause", "promote", "resume"):
            p.add_argument("--reason", required=name != "resume", default="",
                           help="why (recorded with the decision" + (", required)" if name != "resume" else ")"))
            p.add_argument("--operator", default=decide.default_operator(),
                           help="who decides (recorded; default env GPUOBS_OPERATOR or the login name: %(default)s)")
        p.set_defaults(func={"status": run_status, "resume": run_resume, "abort": run_abort, "pause": run_pause,
                             "promote": run_promote}[name])
    k = sub.add_parser("kill", parents=[common], help="kill switch: NAME off on every node now, in one write")
    k.add_argument("name", metavar="NAME", help="flag key")
    k.add_argument("--reason", default="killed from the command line", help="recorded reason")
    k.add_argument("--wait", default="120s", help="how long to wait for a running flag controller to roll back")
    k.set_defaults(func=run_kill)


def _store(args: argparse.Namespace) -> RolloutStore:
    return RolloutStore(Path(args.run_dir) / DB)


def _release_rollout_active(run_dir: str) -> str | None:
    """The id and state of an unfinished release rollout in ``run_dir``, if any."""
    path = Path(run_dir) / "rollout.sqlite"
    if not path.exists():
        return None
    store = RolloutStore(path)
    try:
        rec = store.latest(active_only=True, terminal=TERMINAL)
        return f"{rec.id} ({rec.state})" if rec else None
    finally:
        store.close()


def _drive(args: argparse.Namespace, flag: str | None, fn: Any, rid: str | None = None, spec: Any = None) -> int:
    """Build the flag controller under the flag lock, call ``fn(controller, rid)``, notice, report."""
    try:
        stack = decide.running_stack(args)
    except UsageError as err:
        return fail(err)
    lock, tr = RunLock(args.run_dir, LOCK), tracing.setup(service_name=SERVICE_NAME)
    store = _store(args)
    try:
        if not lock.acquire():
            return fail(f"another flag controller holds {lock.path}; use `gpuobs flag status` or `abort`")
        if flag is None:
            flag = parse_variant(store.get(rid).version)[0]
        client = PromClient(args.prometheus or stack.urls.prometheus)
        fleet = StackFlagFleet(stack, flag)
        ctl = FlagController(store, fleet, PromSignals(client), analyzer_factory(client, args.config),
                             out=lambda line: print(line, flush=True), tracer=tr)
        rid = rid if spec is None else ctl.create(spec).id
        _note(args, store, rid, flag)
        try:
            rec = fn(ctl, rid)
        finally:
            _note(args, store, rid, flag)
        tr.shutdown()
        line = send_notice(stack.urls.alertmanager, rec, str(args.run_dir), flag=flag)
        if line:
            print(line, flush=True)
        print(report(store, rec.id, fleet, args.json, args.prometheus or stack.urls.prometheus), flush=True)
        return EXIT_CODES[rec.state]
    except (UsageError, ConfigError, FleetError, KeyError) as err:
        return fail(err.args[0] if isinstance(err, KeyError) else err)
    finally:
        lock.release()
        store.close()


def _note(args: argparse.Namespace, store: RolloutStore, rid: str, flag: str) -> None:
    """Record the flag rollout in the run directory's activity file as a rollout (as ``gpuobs rollout``
    does), so the incident console relates incidents on its nodes, and its notice, to it."""
    try:
        rec = store.get(rid)
        ended = store.transitions(rid)[-1]["ts"] if rec.state in TERMINAL else None
        run_dir = str(args.run_dir)
        activity.record(run_dir, "rollout", rec.id, title=f"flag rollout {flag}",
                        nodes=rec.spec.get("hosts") or [], started_at=rec.created_at, ended_at=ended,
                        detail={"version": rec.version, "flag": flag,
                                "report": f"gpuobs flag status --run-dir {run_dir} --id {rec.id}",
                                **({"outcome": f"{rec.state}: {rec.reason}"[:300]} if ended else {})})
    except (OSError, KeyError, ValueError) as err:
        print(f"warning: could not record flag rollout {rid} in {activity.path_in(args.run_dir)}: {err}", flush=True)


def run_rollout(args: argparse.Namespace) -> int:
    """Handler of ``flag rollout NAME``."""
    try:
        if args.override_freeze != bool(args.reason and args.reason.strip()):
            raise UsageError("--override-freeze needs --reason TEXT (and --reason is only for --override-freeze)")
        if args.error_limit < 1:
            raise UsageError(f"--error-limit must be >= 1, got {args.error_limit}")
        interval = parse_duration(args.interval, "--interval")
        flag = load(Path(args.releases) if args.releases else None).flag(args.name).name
        stack = decide.running_stack(args)
        busy = _release_rollout_active(args.run_dir)
        if busy:
            raise UsageError(f"release rollout {busy} is unfinished and owns the canary labels; "
                             "finish or abort it first (`gpuobs rollout status`)")
        fleet = StackFlagFleet(stack, flag)
        on = [h for h in fleet.hosts if fleet.version(h).endswith("=on")]
        hosts = on + [h for h in fleet.hosts if h not in on]  # nodes already on form the first canary
        stages = parse_stages(args.stages, len(hosts))
        if len(on) > stages[0]:
            raise UsageError(f"{flag} is already on for {len(on)} node(s) ({', '.join(on)}); the first stage "
                             f"({stages[0]}) must cover them, or `gpuobs flag kill {flag}` first")
        spec = flag_spec(flag, tuple(hosts), tuple(stages), interval_s=interval,
                         stage_timeout_s=parse_duration(args.stage_timeout, "--stage-timeout"),
                         settle_s=0.0 if args.settle in ("0", "0s") else parse_duration(args.settle, "--settle"),
                         bake_s=interval if args.bake is None else 0.0 if args.bake in ("0", "0s")
                         else parse_duration(args.bake, "--bake"),
                         error_limit=args.error_limit,
                         override_reason=(args.reason or "").strip() if args.override_freeze else "")
    except (UsageError, ConfigError, CatalogueError, FleetError, OSError) as err:
        return fail(err)
    except KeyError as err:
        return fail(f"NAME: {err.args[0]}")
    return _drive(args, flag, lambda ctl, rid: ctl.run(rid), spec=spec)


def run_resume(args: argparse.Namespace) -> int:
    """Handler of ``flag resume``: lift a pause (recorded); if no flag controller runs, continue the
    latest (or --id) flag rollout from its persisted state."""
    try:
        rec, handled = decide.lift_pause(args, decide.FLAG, decisions.resume)
    except (UsageError, KeyError) as err:
        return fail(err.args[0] if isinstance(err, KeyError) else err)
    if handled:
        return 0
    return _drive(args, None, lambda ctl, rid: ctl.run(rid), rid=rec.id)


run_pause = decide.pause_handler(decide.FLAG)
run_promote = decide.promote_handler(decide.FLAG)


def _ask_controller(args: argparse.Namespace, store: RolloutStore, rid: str, reason: str, wait_s: float) -> int | None:
    """:func:`gpuobs.cli.decide.hand_abort` for flag rollouts (None: no flag controller runs)."""
    return decide.hand_abort(args.run_dir, decide.FLAG, store, rid, reason, wait_s,
                             lambda st, r: report(st, r, None, as_json=args.json))


def run_abort(args: argparse.Namespace) -> int:
    """Handler of ``flag abort``."""
    try:
        wait_s = parse_duration(args.wait, "--wait")
        with decide.open_store(args.run_dir, decide.FLAG) as store:
            rec = decide.pick(args, store, decide.FLAG)
            if rec.state in TERMINAL:
                raise UsageError(f"flag rollout {rec.id} already ended {rec.state}; nothing to abort "
                                 f"(`gpuobs flag kill {parse_variant(rec.version)[0]}` turns the flag off)")
            code = _ask_controller(args, store, rec.id, args.reason, wait_s)
    except (UsageError, ConfigError, KeyError) as err:
        return fail(err)
    if code is not None:
        return code
    return _drive(args, None, lambda ctl, rid: ctl.abort(rid, args.reason), rid=rec.id)


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
        code = _ask_controller(args, store, rec.id, f"kill switch: {args.reason}", wait_s)
    finally:
        store.close()
    if code is not None:
        return 0
    rc = _drive(args, None, lambda ctl, rid: ctl.abort(rid, f"kill switch: {args.reason}"), rid=rec.id)
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
                print(report(store, rec.id, None, args.json, prometheus))
                printed = True
        except (UsageError, KeyError) as err:
            return fail(err)
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
