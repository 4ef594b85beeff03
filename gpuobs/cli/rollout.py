"""``gpuobs rollout start|status|abort|resume|pause|promote``: the progressive rollout controller's command line.

Works on the native stack of ``--run-dir`` (``<run>/stack.json``: nodes, admin token, Prometheus URL);
the rollout database is ``<run>/rollout.sqlite`` and one controller at a time holds
``<run>/rollout.lock``. Progress goes to stdout, one line per event, then a report with the stage
table and the deciding canary verdict table. Exit codes (design §8; see :mod:`gpuobs.rollout.controller`):
0 Succeeded, 1 RolledBack / Rejected / rollback incomplete, 3 Aborted (inconclusive, operator abort,
Prometheus errors, freeze mid-rollout), 2 usage or input error (one ``error:`` line on stderr).

``pause`` / ``promote`` record a human decision (operator name, reason) that the running controller
acts on at its next wait (:mod:`gpuobs.rollout.decisions`); ``resume`` lifts a pause and, when no
controller is running, drives the rollout on. Both exit 0 once recorded.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpuobs.canary.config import ConfigError, parse_duration
from gpuobs.cli import decide
from gpuobs.cli.common import env as _env
from gpuobs.cli.common import fail
from gpuobs.core import activity
from gpuobs.promapi.prometheus import PromClient
from gpuobs.reference.releases import CatalogueError, load
from gpuobs.rollout import decisions, tracing
from gpuobs.rollout.adapters.native import StackFleet
from gpuobs.rollout.adapters.prometheus import PromSignals, analyzer_factory
from gpuobs.rollout.controller import Controller
from gpuobs.rollout.interfaces import FleetError
from gpuobs.rollout.model import EXIT_CODES, TERMINAL, RolloutSpec, UsageError, parse_stages
from gpuobs.rollout.report import report
from gpuobs.rollout.store import RolloutStore, RunLock
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
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--run-dir", default=_env("RUN_DIR", ".run"), help="stack run directory (env GPUOBS_RUN_DIR)")
    common.add_argument("--prometheus", default=_env("PROMETHEUS_URL"), metavar="URL",
                        help="Prometheus URL (env GPUOBS_PROMETHEUS_URL; default: the stack's)")
    common.add_argument("--config", default=_env("CANARY_CONFIG"), metavar="FILE",
                        help="canary metrics YAML (env GPUOBS_CANARY_CONFIG; default: packaged metrics.yaml)")
    common.add_argument("--json", action="store_true", help="final report as one JSON object")
    s = sub.add_parser("start", parents=[common], help="start a rollout and drive it to the end", epilog=START_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--version", required=True, help="release version from the catalogue, e.g. 1.5.0")
    s.add_argument("--stages", default="1,25%,50%,100%",
                   help="cumulative node counts (1) or shares (25%%) of the serving nodes (default 1,25%%,50%%,100%%)")
    s.add_argument("--interval", default="30s", help="analysis look interval (default 30s)")
    s.add_argument("--stage-timeout", default="5m", help="analysis deadline per canary stage = analysis horizon (5m)")
    s.add_argument("--settle", default="10s", help="wait after relabelling before the analysis window opens (10s)")
    s.add_argument("--bake", default=None, help="SLO-page watch after deploying 100%% (default: one interval)")
    s.add_argument("--error-limit", type=int, default=3, help="consecutive Prometheus errors before abort (3)")
    s.add_argument("--releases", default=_env("RELEASES"), metavar="FILE",
                   help="release catalogue (env GPUOBS_RELEASES)")
    s.add_argument("--override-freeze", action="store_true", help="start/continue despite an exhausted error budget")
    s.add_argument("--reason", help="why the freeze is overridden (required with --override-freeze; recorded)")
    s.set_defaults(func=run_start)
    for name, helptext in (("status", "show the latest (or --id) rollout"),
                           ("resume", "lift a pause; continue an unfinished rollout from its last persisted state"),
                           ("abort", "abort the active rollout: roll back every touched node"),
                           ("pause", "hold the rollout for a human decision: no look, no verdict acted on, "
                                     "no stage advance (recorded)"),
                           ("promote", "pass the current stage now, whatever the analysis says (recorded)")):
        p = sub.add_parser(name, parents=[common], help=helptext)
        p.add_argument("--id", help="rollout id (default: the latest)")
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


def _controller(args: argparse.Namespace, stack: dict[str, Any], store: RolloutStore,
                tr: tracing.Tracing) -> tuple[Controller, StackFleet]:
    client = PromClient(args.prometheus or stack.urls.prometheus)
    fleet = StackFleet(stack)
    ctl = Controller(store, fleet, PromSignals(client), analyzer_factory(client, args.config),
                     out=lambda line: print(line, flush=True), tracer=tr)
    return ctl, fleet


def _drive(args: argparse.Namespace, fn: Any, rid: str | None = None, spec: RolloutSpec | None = None) -> int:
    """Build the controller under the run lock, call ``fn(controller, rid or spec)``, print the report."""
    try:
        stack = decide.running_stack(args)
    except UsageError as err:
        return fail(err)
    lock, store, tr = RunLock(args.run_dir), RolloutStore(Path(args.run_dir) / "rollout.sqlite"), tracing.setup()
    try:
        if not lock.acquire():
            return fail(f"another rollout controller holds {lock.path}; use `gpuobs rollout status` or `abort`")
        ctl, fleet = _controller(args, stack, store, tr)
        rid = rid if spec is None else ctl.create(spec).id
        _note(args, store, rid)
        try:
            rec = fn(ctl, rid)
        finally:
            _note(args, store, rid)
        tr.shutdown()
        from gpuobs.rollout.notices import send as send_notice  # RolledBack/Rejected/Aborted -> Alertmanager

        line = send_notice(stack.urls.alertmanager, rec, str(args.run_dir))
        if line:
            print(line, flush=True)
        print(report(store, rec.id, fleet, args.json, args.prometheus or stack.urls.prometheus), flush=True)
        return EXIT_CODES[rec.state]
    except (UsageError, ConfigError, FleetError, KeyError) as err:
        return fail(err.args[0] if isinstance(err, KeyError) else err)
    finally:
        lock.release()
        store.close()


def _note(args: argparse.Namespace, store: RolloutStore, rid: str) -> None:
    """Record the rollout in the run directory's activity file (:mod:`gpuobs.core.activity`), so the
    incident console links incidents on its nodes to it: its start, and its end once terminal. A
    failure to write is a warning line, never fatal."""
    try:
        rec = store.get(rid)
        ended = store.transitions(rid)[-1]["ts"] if rec.state in TERMINAL else None
        run_dir = str(args.run_dir)
        activity.record(run_dir, "rollout", rec.id, title=f"rollout {rec.version}",
                        nodes=rec.spec.get("hosts") or [], started_at=rec.created_at, ended_at=ended,
                        detail={"version": rec.version, "report": f"gpuobs rollout status --run-dir {run_dir} --id "
                                                                  f"{rec.id}",
                                **({"outcome": f"{rec.state}: {rec.reason}"[:300]} if ended else {})})
    except (OSError, KeyError, ValueError) as err:
        print(f"warning: could not record rollout {rid} in {activity.path_in(args.run_dir)}: {err}", flush=True)


def run_start(args: argparse.Namespace) -> int:
    """Handler of ``rollout start``."""
    try:
        if args.override_freeze != bool(args.reason and args.reason.strip()):
            raise UsageError("--override-freeze needs --reason TEXT (and --reason is only for --override-freeze)")
        if args.error_limit < 1:
            raise UsageError(f"--error-limit must be >= 1, got {args.error_limit}")
        interval = parse_duration(args.interval, "--interval")
        release = load(Path(args.releases) if args.releases else None).get(args.version)
        stack = decide.running_stack(args)
        if (Path(args.run_dir) / "flag.sqlite").exists():  # a flag rollout owns the canary labels meanwhile
            flags = RolloutStore(Path(args.run_dir) / "flag.sqlite")
            busy = flags.latest(active_only=True, terminal=TERMINAL)
            flags.close()
            if busy:
                raise UsageError(f"flag rollout {busy.id} ({busy.state}) is unfinished and owns the canary labels; "
                                 "finish or abort it first (`gpuobs flag status`)")
        hosts = StackFleet(stack).hosts
        spec = RolloutSpec(release.version, release.engine, release.cuda, tuple(hosts),
                           tuple(parse_stages(args.stages, len(hosts))), interval,
                           parse_duration(args.stage_timeout, "--stage-timeout"),
                           0.0 if args.settle in ("0", "0s") else parse_duration(args.settle, "--settle"),
                           interval if args.bake is None else 0.0 if args.bake in ("0", "0s")
                           else parse_duration(args.bake, "--bake"),
                           args.error_limit, (args.reason or "").strip() if args.override_freeze else "")
    except (UsageError, ConfigError, CatalogueError, FleetError, OSError) as err:
        return fail(err)
    except KeyError as err:
        return fail(f"--version: {err.args[0]}")
    return _drive(args, lambda ctl, rid: ctl.run(rid), spec=spec)


def run_resume(args: argparse.Namespace) -> int:
    """Handler of ``rollout resume``: lift a pause (recorded); if no controller is running, continue
    the latest (or --id) rollout from its persisted state."""
    try:
        rec, handled = decide.lift_pause(args, decide.RELEASE, decisions.resume)
    except (UsageError, KeyError) as err:
        return fail(err)
    if handled:
        return 0
    return _drive(args, lambda ctl, rid: ctl.run(rid), rid=rec.id)


run_pause = decide.pause_handler(decide.RELEASE)
run_promote = decide.promote_handler(decide.RELEASE)


def run_abort(args: argparse.Namespace) -> int:
    """Handler of ``rollout abort``: roll back itself if no controller runs, else ask it and wait."""
    try:
        wait_s = parse_duration(args.wait, "--wait")
        with decide.open_store(args.run_dir, decide.RELEASE) as store:
            rec = decide.pick(args, store)
            if rec.state in TERMINAL:
                raise UsageError(f"rollout {rec.id} already ended {rec.state}; nothing to abort")
            code = decide.hand_abort(args.run_dir, decide.RELEASE, store, rec.id, args.reason, wait_s,
                                     lambda st, rid: report(st, rid, None, as_json=args.json))
    except (UsageError, ConfigError, KeyError) as err:
        return fail(err)
    if code is not None:
        return code
    return _drive(args, lambda ctl, rid: ctl.abort(rid, args.reason), rid=rec.id)


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
        return fail(err)
    return 0
