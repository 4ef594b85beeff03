"""What ``gpuobs rollout`` and ``gpuobs flag`` share: their common options, the ``status`` /
``resume`` / ``abort`` / ``pause`` / ``promote`` subcommands, the human decisions (``pause``,
``promote``, ``resume``'s pause-lifting and ``abort``'s hand-off to a running controller) and
driving a controller in this process (:func:`drive`: the run lock, the activity record, the notice,
the report of :func:`gpuobs.rollout.report.report`).

Both groups keep a rollout store (SQLite, :class:`gpuobs.rollout.store.RolloutStore`) and one
controller lock (:class:`gpuobs.rollout.store.RunLock`) in the run directory, and record decisions
through :mod:`gpuobs.rollout.decisions`; they differ in file names, nouns and help texts, which a
:class:`Kind` carries, and in the controller and fleet they build, which a :class:`Driver` adds. A
busy lock means a live controller: decisions are recorded for it to act on at its next wait, and an
abort is written to the store for it to carry out (the caller waits). A free lock means nobody
drives the rollout: the caller acts itself (``resume`` / ``abort`` drive the controller in this
process). Errors are :class:`gpuobs.rollout.model.UsageError` (no rollout recorded, unknown
``--id``, no running stack) or ``KeyError`` from the store; handlers print them as one error line
(exit 2), helpers raise them for the group modules to print.
"""

from __future__ import annotations

import argparse
import getpass
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuobs.cli.common import env, fail, fleet_config
from gpuobs.core import activity
from gpuobs.core.durations import parse_duration
from gpuobs.core.errors import ConfigError, InputError
from gpuobs.core.fleet import FleetConfig, FleetConfigError, shipped_fleet
from gpuobs.promapi.prometheus import PromClient
from gpuobs.reference.releases import CatalogueError
from gpuobs.rollout import decisions, tracing
from gpuobs.rollout.adapters.prometheus import PromSignals, analyzer_factory
from gpuobs.rollout.flag import parse_variant
from gpuobs.rollout.interfaces import Fleet, FleetError
from gpuobs.rollout.model import EXIT_CODES, TERMINAL, UsageError
from gpuobs.rollout.notices import send as send_notice
from gpuobs.rollout.notices import send_in_progress
from gpuobs.rollout.report import report
from gpuobs.rollout.store import RolloutStore, RunLock
from gpuobs.stack.state import StackState
from gpuobs.stack.supervisor import load_state


@dataclass(frozen=True)
class Kind:
    """What differs between release and flag rollouts in the commands both groups have.

    ``noun`` starts the printed lines ("rollout", "flag rollout"), ``group`` is the CLI group in
    hints (``gpuobs <group> resume``), ``db`` / ``lock`` are file names in the run directory,
    ``controller`` names the process that drives it, ``abort_action`` says what that process does on
    an abort, ``service`` is its traces' OpenTelemetry service name. ``flags``: the rollouts are flag
    rollouts, whose record's version is the flag's variant (``<flag>=on``) and whose ``abort`` of an
    ended one hints at the kill switch. ``*_help``: the help lines of ``status``, ``resume``,
    ``abort`` and ``pause`` (``promote``'s is :data:`PROMOTE_HELP`)."""

    noun: str
    group: str
    db: str
    lock: str
    controller: str
    abort_action: str
    service: str
    flags: bool
    status_help: str
    resume_help: str
    abort_help: str
    pause_help: str


RELEASE = Kind("rollout", "rollout", "rollout.sqlite", "rollout.lock", "controller", "roll back",
               service=tracing.SERVICE_NAME, flags=False,
               status_help="show the latest (or --id) rollout",
               resume_help="lift a pause; continue an unfinished rollout from its last persisted state",
               abort_help="abort the active rollout: roll back every touched node",
               pause_help="hold the rollout for a human decision: no look, no verdict acted on, no stage advance "
                          "(recorded)")
FLAG = Kind("flag rollout", "flag", "flag.sqlite", "flag.lock", "flag controller", "pull the kill switch",
            service="gpuobs-flag-rollout", flags=True,
            status_help="show the latest (or --id) flag rollout and where each flag is on",
            resume_help="lift a pause; continue an unfinished flag rollout from its persisted state",
            abort_help="abort the active flag rollout: kill switch, flag off everywhere",
            pause_help="hold the flag rollout for a human decision (no look acted on, no stage advance)")
UPGRADE = Kind("driver upgrade", "upgrade", "upgrade.sqlite", "upgrade.lock", "upgrade controller",
               "roll back the regressed GPU model's nodes (an abort: every upgraded node)",
               service="gpuobs-driver-upgrade", flags=False,
               status_help="show the latest (or --id) driver upgrade: batches, per-GPU-model verdicts, drivers now",
               resume_help="lift a pause; continue an unfinished driver upgrade from its persisted state",
               abort_help="abort the active driver upgrade: every upgraded node back to its previous driver",
               pause_help="hold the driver upgrade for a human decision: no look acted on, no next batch (recorded)")
PROMOTE_HELP = "pass the current stage now, whatever the analysis says (recorded)"


@dataclass(frozen=True)
class Driver:
    """How a group drives its rollouts in this process (:func:`drive`): its :class:`Kind`, its
    controller class, called as ``controller(store, fleet, signals, analyzers, out=, tracer=)``
    (:class:`gpuobs.rollout.controller.Controller` or :class:`gpuobs.rollout.flag.FlagController`),
    and ``fleet(stack, flag)``, the fleet it acts on in the running stack (``flag`` is None for
    release rollouts)."""

    kind: Kind
    controller: Callable[..., Any]
    fleet: Callable[[StackState, str | None], Fleet]
    #: Further keywords of the controller, from the fleet config (a driver upgrade: its identity label).
    options: Callable[[FleetConfig], dict[str, Any]] = lambda cfg: {}


# -- options and subcommands ------------------------------------------------------------------------

def group_options() -> argparse.ArgumentParser:
    """The parent parser of every subcommand of both groups: ``--run-dir``, ``--prometheus``,
    ``--config``, ``--fleet`` (each with its ``GPUOBS_*`` environment default) and ``--json``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--run-dir", default=env("RUN_DIR", ".run"), help="stack run directory (env GPUOBS_RUN_DIR)")
    common.add_argument("--prometheus", default=env("PROMETHEUS_URL"), metavar="URL",
                        help="Prometheus URL (env GPUOBS_PROMETHEUS_URL; default: the stack's)")
    common.add_argument("--config", default=env("CANARY_CONFIG"), metavar="FILE",
                        help="canary metrics YAML (env GPUOBS_CANARY_CONFIG; default: packaged metrics.yaml)")
    common.add_argument("--fleet", default=env("FLEET_CONFIG"), metavar="FILE",
                        help="fleet config (format of prometheus/fleet.yaml; env GPUOBS_FLEET_CONFIG; default: the "
                             "shipped one): the identity label of the gates' queries and the runbook_base of the "
                             "notices' runbook_url")
    common.add_argument("--json", action="store_true", help="final report as one JSON object")
    return common


def fleet_of(args: argparse.Namespace) -> FleetConfig:
    """The fleet config the rollout acts under: ``--fleet FILE`` (or ``$GPUOBS_FLEET_CONFIG``) through
    :func:`gpuobs.cli.common.fleet_config`, else the shipped one (``prometheus/fleet.yaml``, which the
    local stack's scrape config follows). Raises FleetConfigError (an input error naming the flag)."""
    return fleet_config(args.fleet) if getattr(args, "fleet", None) else shipped_fleet()


def add_drive_options(p: argparse.ArgumentParser, bake_help: str) -> None:
    """The options of the commands that start a rollout (``rollout start``, ``flag rollout``): stages,
    timings, error limit, release catalogue, freeze override; read back by :func:`start`
    (:func:`checked_interval`) and :func:`timings`. ``bake_help``: ``--bake``'s help line."""
    p.add_argument("--stages", default="1,25%,50%,100%",
                   help="cumulative node counts (1) or shares (25%%) of the serving nodes (default 1,25%%,50%%,100%%)")
    p.add_argument("--interval", default="30s", help="analysis look interval (default 30s)")
    p.add_argument("--stage-timeout", default="5m", help="analysis deadline per canary stage = analysis horizon (5m)")
    p.add_argument("--settle", default="10s", help="wait after relabelling before the analysis window opens (10s)")
    p.add_argument("--bake", default=None, help=bake_help)
    p.add_argument("--error-limit", type=int, default=3, help="consecutive Prometheus errors before abort (3)")
    p.add_argument("--releases", default=env("RELEASES"), metavar="FILE",
                   help="release catalogue (env GPUOBS_RELEASES)")
    p.add_argument("--override-freeze", action="store_true", help="start/continue despite an exhausted error budget")
    p.add_argument("--reason", help="why the freeze is overridden (required with --override-freeze; recorded)")


def add_decision_commands(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser, driver: Driver,
                          status: Callable[[argparse.Namespace], int]) -> None:
    """Add ``status``, ``resume``, ``abort``, ``pause`` and ``promote`` to ``sub``, each with
    ``parent``'s options and ``--id``; ``abort`` with ``--reason`` and ``--wait``, the decisions
    (``pause``, ``promote``, ``resume``) with ``--reason`` (required but for ``resume``) and
    ``--operator``. Help lines from ``driver.kind``. Handlers (``func(args) -> int``): ``status``
    as given, the others :func:`resume_handler`, :func:`abort_handler`,
    :func:`pause_handler` and :func:`promote_handler` of ``driver``."""
    kind = driver.kind
    handlers = {"status": status, "resume": resume_handler(driver), "abort": abort_handler(driver),
                "pause": pause_handler(kind), "promote": promote_handler(kind)}
    for name, helptext in (("status", kind.status_help), ("resume", kind.resume_help), ("abort", kind.abort_help),
                           ("pause", kind.pause_help), ("promote", PROMOTE_HELP)):
        p = sub.add_parser(name, parents=[parent], help=helptext, description=helptext[:1].upper() + helptext[1:] + ".")
        p.add_argument("--id", help=f"{kind.noun} id (default: the latest)")
        if name == "abort":
            p.add_argument("--reason", default="aborted from the command line", help="recorded abort reason")
            p.add_argument("--wait", default="120s", metavar="DURATION",
                           help="how long to wait for a running controller to finish, e.g. 90s, 5m (default %(default)s)")
        if name in ("pause", "promote", "resume"):
            p.add_argument("--reason", required=name != "resume", default="",
                           help="why (recorded with the decision" + (", required)" if name != "resume" else ")"))
            p.add_argument("--operator", default=default_operator(),
                           help="who decides (recorded; default env GPUOBS_OPERATOR or the login name: %(default)s)")
        p.set_defaults(func=handlers[name])


def checked_interval(args: argparse.Namespace) -> float:
    """The first checks of ``rollout start`` / ``flag rollout``: ``--override-freeze`` goes with a
    non-blank ``--reason`` (and only with it), ``--error-limit`` >= 1. Returns ``--interval`` in
    seconds. Raises UsageError, or ConfigError for a malformed duration."""
    if args.override_freeze != bool(args.reason and args.reason.strip()):
        raise UsageError("--override-freeze needs --reason TEXT (and --reason is only for --override-freeze)")
    if args.error_limit < 1:
        raise UsageError(f"--error-limit must be >= 1, got {args.error_limit}")
    return parse_duration(args.interval, "--interval")


def timings(args: argparse.Namespace, interval: float, timeout_flag: str = "--stage-timeout") -> dict[str, Any]:
    """:class:`gpuobs.rollout.model.RolloutSpec`'s timing keywords from the options, seconds:
    ``interval_s`` (given, from :func:`checked_interval`), ``stage_timeout_s`` (``args.stage_timeout``,
    named ``timeout_flag`` in errors: ``upgrade run`` calls it ``--batch-timeout``), ``settle_s`` (may be 0),
    ``bake_s`` (default one interval; may be 0), ``error_limit`` and
    ``override_reason`` (stripped; empty without ``--override-freeze``). Raises ConfigError for a
    malformed duration."""
    return {"interval_s": interval, "stage_timeout_s": parse_duration(args.stage_timeout, timeout_flag),
            "settle_s": parse_duration(args.settle, "--settle", allow_zero=True),
            "bake_s": interval if args.bake is None else parse_duration(args.bake, "--bake", allow_zero=True),
            "error_limit": args.error_limit,
            "override_reason": (args.reason or "").strip() if args.override_freeze else ""}


def refuse_if_unfinished(run_dir: str | Path, kind: Kind, noun: str) -> None:
    """Raise UsageError when the run directory's ``kind`` store holds an unfinished rollout (it owns
    the canary labels: a release and a flag rollout never run at once); ``noun`` names it in the
    message. Nothing when that store does not exist."""
    path = Path(run_dir) / kind.db
    if not path.exists():
        return
    store = RolloutStore(path)
    try:
        busy = store.latest(active_only=True, terminal=TERMINAL)
    finally:
        store.close()
    if busy:
        raise UsageError(f"{noun} {busy.id} ({busy.state}) is unfinished and owns the canary labels; "
                         f"finish or abort it first (`gpuobs {kind.group} status`)")


#: What each kind is called where another kind refuses to start beside it.
OTHER_NOUN = {"rollout": "release rollout", "flag": "flag rollout", "upgrade": "driver upgrade"}

#: The lock every ``start`` holds from its final cross-kind check to its rollout's creation (``<run>/start.lock``).
START_LOCK = "start.lock"


def refuse_other_unfinished(run_dir: str | Path, kind: Kind) -> None:
    """Raise UsageError when a rollout of another kind than ``kind`` (release, flag, driver upgrade) is
    unfinished in ``run_dir``: a release and a flag rollout own the canary labels, a driver upgrade's
    judge reads the whole fleet, so no two run at once (:func:`refuse_if_unfinished` per kind)."""
    for other in (RELEASE, FLAG, UPGRADE):
        if other.group != kind.group:
            refuse_if_unfinished(run_dir, other, OTHER_NOUN[other.group])


def default_operator() -> str:
    """Who decides when ``--operator`` is not given: env GPUOBS_OPERATOR, else the login name, else ``unknown``."""
    try:
        return os.environ.get("GPUOBS_OPERATOR") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def running_stack(args: argparse.Namespace) -> StackState:
    """The running native stack of ``args.run_dir`` (its ``stack.json``), which both groups drive.

    Raises UsageError when there is none (no state file, or the stack is down)."""
    state = load_state(Path(args.run_dir))
    if not state or not state.running:
        raise UsageError(f"no running stack in {args.run_dir}; start one with `make up` (or pass --run-dir)")
    return state


def start(driver: Driver, args: argparse.Namespace, plan: Callable[[argparse.Namespace, float], Any],
          unknown: str) -> int:
    """``rollout start`` / ``flag rollout``: :func:`checked_interval`, then ``plan(args, interval)``
    -> the :class:`gpuobs.rollout.model.RolloutSpec` to run (it reads the catalogue and the running
    stack), then :func:`drive` it to the end. Returns the exit code of its final state, or 2 with
    one error line for a usage, config, catalogue, fleet or file error; a KeyError (not in the
    catalogue) is said to be about option ``unknown`` (``--version``, ``NAME``)."""
    try:
        spec = plan(args, checked_interval(args))
    # InputError: ConfigError, FleetConfigError, DriverCatalogueError
    except (UsageError, InputError, CatalogueError, FleetError, OSError) as err:
        return fail(err)
    except KeyError as err:
        return fail(f"{unknown}: {err.args[0]}")
    return drive(driver, args, lambda ctl, rid: ctl.run(rid), spec=spec)


def drive(driver: Driver, args: argparse.Namespace, fn: Callable[[Any, str], Any], rid: str | None = None,
          spec: Any = None) -> int:
    """Drive a rollout in this process: under ``driver.kind``'s run lock, build the controller over
    the running stack's fleet and Prometheus (``--prometheus``, else the stack's), create ``spec`` (a
    :class:`gpuobs.rollout.model.RolloutSpec`) or take rollout ``rid``, call ``fn(controller, rid)``
    (``run`` or ``abort``; it returns the final record), record the rollout in the activity file
    before and after (:func:`note`), post its notice (:func:`gpuobs.rollout.notices.send`, its
    runbook link under the fleet config's ``runbook_base``, :func:`fleet_of`) and print the report.
    Returns the exit code of its final state (:data:`gpuobs.rollout.model.EXIT_CODES`), or 2 with one
    error line: no running stack, a bad fleet config, the lock held by another controller, a usage,
    config, fleet or store error."""
    kind = driver.kind
    try:
        stack = running_stack(args)
        fleet_cfg = fleet_of(args)
    except (UsageError, FleetConfigError) as err:
        return fail(err)
    try:
        client = PromClient(args.prometheus or stack.urls.prometheus)
    except ValueError as exc:  # not an http(s) URL
        return fail(f"--prometheus: {exc}")
    try:  # before the store exists: a bad --config leaves no empty database behind
        factory = analyzer_factory(client, args.config)
    except ConfigError as err:
        return fail(err)
    lock, store = RunLock(args.run_dir, kind.lock), RolloutStore(Path(args.run_dir) / kind.db)
    tr = tracing.setup(service_name=kind.service)
    try:
        if not lock.acquire():
            return fail(f"another {kind.group} controller holds {lock.path}; use `gpuobs {kind.group} status` or "
                        "`abort`")
        flag = parse_variant(spec.version if spec is not None else store.get(rid).version)[0] if kind.flags else None
        fleet = driver.fleet(stack, flag)
        ctl = driver.controller(store, fleet, PromSignals(client, fleet_cfg), factory,
                                out=lambda line: print(line, flush=True), tracer=tr, **driver.options(fleet_cfg))
        if spec is not None:
            # each kind has its own run lock, so two starts of different kinds (a `rollout start` and an
            # `upgrade run` at the same instant) could both pass plan()'s checks: the last check and the
            # creation run under one lock shared by every kind
            with RunLock(args.run_dir, START_LOCK) as start_lock:
                start_lock.acquire(wait=True)
                refuse_other_unfinished(args.run_dir, kind)
                rid = ctl.create(spec).id
        note(args, kind, store, rid, flag)
        runbook_base = stack.runbook_base or fleet_cfg.runbook_base
        if kind.group == UPGRADE.group:  # GpuDriverSkew is inhibited while the upgrade runs
            _warn(send_in_progress(stack.urls.alertmanager, store.get(rid), str(args.run_dir), runbook_base,
                                   time.time() + upgrade_span_s(store.get(rid))))
        try:
            rec = fn(ctl, rid)
        finally:
            note(args, kind, store, rid, flag)
            if kind.group == UPGRADE.group:
                _warn(send_in_progress(stack.urls.alertmanager, store.get(rid), str(args.run_dir), runbook_base,
                                       time.time()))
        tr.shutdown()
        ended_in = store.stage(rec.id, rec.stage) if rec.stage >= 0 else None
        # the stack's rules link runbooks to its own pager: so do its notices
        line = send_notice(stack.urls.alertmanager, rec, str(args.run_dir), stack.runbook_base or fleet_cfg.runbook_base,
                           flag=flag, stage=ended_in, group=kind.group)  # RolledBack/... -> Alertmanager
        if line:
            print(line, flush=True)
            impact_line = notice_impact(client, fleet_cfg, rec, str(args.run_dir), stack.runbook_base or
                                        fleet_cfg.runbook_base, flag, ended_in, kind.group)
            if impact_line:
                print(impact_line, flush=True)
        print(report(store, rec.id, fleet, args.json, args.prometheus or stack.urls.prometheus, kind.group,
                     fleet_cfg.identity_label), flush=True)
        return EXIT_CODES[rec.state]
    except (UsageError, ConfigError, FleetError, KeyError) as err:
        return fail(problem(err))
    finally:
        lock.release()
        store.close()


def upgrade_span_s(rec: Any) -> float:
    """How long driver upgrade ``rec`` can take at most, seconds: per batch its settle and timeout plus
    10 minutes for the node procedure, and the bake (the in-progress alert's lifetime)."""
    spec = rec.spec
    return len(spec.get("stages") or []) * (float(spec.get("settle_s", 0)) + float(spec.get("stage_timeout_s", 0))
                                            + 600.0) + float(spec.get("bake_s", 0))


def _warn(line: str | None) -> None:
    if line:
        print(line, flush=True)


def notice_impact(client: PromClient, fleet_cfg, rec: Any, run_dir: str, runbook_base: str, flag: str | None,
                  stage: Any, group: str = "rollout") -> str | None:
    """``impact: <line>``: what the rollout's noticed stage cost on its nodes (:mod:`gpuobs.pager.impact`,
    the same numbers the pager shows on the notice's incident), or a line saying why it could not be
    measured; None when the notice names no nodes (no stage ran)."""
    from gpuobs.pager import impact
    from gpuobs.promapi.prometheus import PrometheusError
    from gpuobs.rollout.notices import notice

    alert = notice(rec, run_dir, runbook_base, flag=flag, stage=stage, group=group)
    if alert is None or "affected_nodes" not in alert["annotations"]:
        return None
    try:
        doc = impact.measure(client, impact.load_config(fleet_cfg), impact.of_alert(alert, time.time()), time.time())
    except PrometheusError as exc:
        return f"impact: not measured ({str(exc).splitlines()[0][:200]})"
    return f"impact: {doc['line']}"


def problem(err: Exception) -> str:
    """The one-line text of an error a handler prints: a KeyError's message as the store wrote it
    (``str(KeyError)`` would wrap it in quotes), any other error's ``str``."""
    return str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)


def note(args: argparse.Namespace, kind: Kind, store: RolloutStore, rid: str, flag: str | None = None) -> None:
    """Record rollout ``rid`` in the run directory's activity file (:mod:`gpuobs.core.activity`) as a
    ``rollout``, so the incident console links incidents on its nodes (and its notice) to it: its
    start, and its end once terminal. ``flag``: a flag rollout's flag (its title, and in the detail).
    A failure to write is a warning line, never fatal."""
    try:
        rec = store.get(rid)
        ended = store.transitions(rid)[-1]["ts"] if rec.state in TERMINAL else None
        run_dir = str(args.run_dir)
        activity.record(run_dir, "rollout", rec.id, title=f"{kind.noun} {flag or rec.version}",
                        nodes=rec.spec.get("hosts") or [], started_at=rec.created_at, ended_at=ended,
                        detail={"version": rec.version, **({"flag": flag} if flag else {}),
                                "report": f"gpuobs {kind.group} status --run-dir {run_dir} --id {rec.id}",
                                **({"outcome": f"{rec.state}: {rec.reason}"[:300]} if ended else {})})
    except (OSError, KeyError, ValueError) as err:
        print(f"warning: could not record {kind.noun} {rid} in {activity.path_in(args.run_dir)}: {err}", flush=True)


@contextmanager
def open_store(run_dir: str | Path, kind: Kind) -> Iterator[RolloutStore]:
    """The run directory's store of ``kind``, closed on exit.

    Raises UsageError when no such rollout was ever recorded there (the file does not exist)."""
    path = Path(run_dir) / kind.db
    if not path.exists():
        raise UsageError(f"no {kind.noun} recorded in {run_dir} ({path} does not exist)")
    store = RolloutStore(path)
    try:
        yield store
    finally:
        store.close()


def pick(args: argparse.Namespace, store: RolloutStore, kind: Kind = RELEASE) -> Any:
    """The record ``--id`` names, else the latest. Raises UsageError on an empty store or an unknown
    ``--id`` (``--id: no <kind> 'x' in <store>``)."""
    try:
        rec = store.get(args.id) if args.id else store.latest()
    except KeyError:
        raise UsageError(f"--id: no {kind.noun} {args.id!r} in {store.path}") from None
    if rec is None:
        raise UsageError(f"no {kind.noun} recorded in {store.path}")
    return rec


def controller_running(run_dir: str | Path, kind: Kind) -> bool:
    """True when a live process holds ``kind``'s lock in ``run_dir`` (the kernel frees it when that process dies)."""
    lock = RunLock(run_dir, kind.lock)
    if lock.acquire():
        lock.release()
        return False
    return True


def decide(args: argparse.Namespace, kind: Kind, fn: Callable[..., Any], verb: str) -> None:
    """Record ``fn(store, id, operator, reason)`` (:func:`gpuobs.rollout.decisions.pause` or
    ``promote``) on the ``--id`` or latest rollout and print one line saying who acts on it."""
    with open_store(args.run_dir, kind) as store:
        rec = fn(store, pick(args, store, kind).id, args.operator, args.reason, noun=kind.noun)
    running = controller_running(args.run_dir, kind)
    print(f"{kind.noun} {rec.id}: {verb} by {args.operator}: {args.reason.strip()} (recorded; "
          + (f"the running {kind.controller} acts on it at its next wait)" if running else
             f"no {kind.controller} is running: `gpuobs {kind.group} resume` acts on it)"), flush=True)


def recorder(kind: Kind, fn: Callable[..., Any], verb: str) -> Callable[[argparse.Namespace], int]:
    """The handler of ``<group> pause`` or ``promote``: :func:`decide`, 0 once recorded, 2 (one error
    line) when there is no such rollout or ``--id``."""
    def handler(args: argparse.Namespace) -> int:
        try:
            decide(args, kind, fn, verb)
        except (UsageError, KeyError) as err:
            return fail(problem(err))
        return 0
    handler.__doc__ = f"Handler of ``{kind.group} {verb.split()[0]}``: record it; the running controller acts on it."
    return handler


def pause_handler(kind: Kind) -> Callable[[argparse.Namespace], int]:
    """``<group> pause``: the controller holds at its next wait."""
    return recorder(kind, decisions.pause, "pause requested")


def promote_handler(kind: Kind) -> Callable[[argparse.Namespace], int]:
    """``<group> promote``: the controller passes the current stage."""
    return recorder(kind, decisions.promote, "promote requested")


def lift_pause(args: argparse.Namespace, kind: Kind, lift: Callable[..., Any]) -> tuple[Any, bool]:
    """``resume``'s first half: lift the pause of the ``--id`` or latest rollout (``lift`` is
    :func:`gpuobs.rollout.decisions.resume`), printing who lifted it.

    Returns ``(record, handled)``: ``handled`` is True when a running controller carries on, so the
    caller has nothing more to do; else the caller drives the rollout itself."""
    with open_store(args.run_dir, kind) as store:
        rec = pick(args, store, kind)
        if not rec.paused:
            return rec, False
        lift(store, rec.id, args.operator, args.reason, noun=kind.noun)
    print(f"{kind.noun} {rec.id}: resumed by {args.operator} (paused by {rec.paused.get('operator')}: "
          f"{rec.paused.get('reason')})", flush=True)
    if controller_running(args.run_dir, kind):
        print(f"the running {kind.controller} continues", flush=True)
        return rec, True
    return rec, False


def hand_abort(run_dir: str | Path, kind: Kind, store: RolloutStore, rid: str, reason: str, wait_s: float,
               show: Callable[[RolloutStore, str], str], sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> int | None:
    """Give an abort to the live controller, if one runs: record ``reason`` as the rollout's abort
    reason, wait up to ``wait_s`` seconds for it to reach a terminal state, print ``show(store, rid)``
    and return its exit code (3 when it did not end in time).

    Returns None when no controller runs (nothing recorded): the caller rolls back itself."""
    if not controller_running(run_dir, kind):
        return None
    store.update(rid, abort_reason=reason)
    print(f"abort requested; waiting up to {wait_s:.0f}s for the {kind.controller} to {kind.abort_action}",
          flush=True)
    deadline = clock() + wait_s
    while store.get(rid).state not in TERMINAL and clock() < deadline:
        sleep(0.5)
    rec = store.get(rid)
    print(show(store, rid))
    return EXIT_CODES[rec.state] if rec.state in TERMINAL else 3


def resume_handler(driver: Driver) -> Callable[[argparse.Namespace], int]:
    """The handler of ``<group> resume``: lift the pause of the ``--id`` or latest rollout (recorded);
    when no controller of its kind runs, continue it from its persisted state in this process
    (:func:`drive`). Returns the exit code; 2 with one error line when there is no such rollout."""
    kind = driver.kind

    def handler(args: argparse.Namespace) -> int:
        try:
            rec, handled = lift_pause(args, kind, decisions.resume)
        except (UsageError, KeyError) as err:
            return fail(problem(err))
        if handled:
            return 0
        return drive(driver, args, lambda ctl, rid: ctl.run(rid), rid=rec.id)
    handler.__doc__ = (f"Handler of ``{kind.group} resume``: lift a pause (recorded); if no {kind.controller} runs, "
                       f"continue the latest (or --id) {kind.noun} from its persisted state.")
    return handler


def ask_controller(args: argparse.Namespace, kind: Kind, store: RolloutStore, rid: str, reason: str,
                   wait_s: float) -> int | None:
    """:func:`hand_abort` showing the rollout's report (JSON with ``--json``) once it ended; None
    when no controller of ``kind`` runs."""
    return hand_abort(args.run_dir, kind, store, rid, reason, wait_s,
                      lambda st, r: report(st, r, None, as_json=args.json, group=kind.group))


def abort_handler(driver: Driver) -> Callable[[argparse.Namespace], int]:
    """The handler of ``<group> abort``: the ``--id`` or latest rollout, unless it already ended (2),
    handed to its running controller (:func:`ask_controller`, waiting up to ``--wait``), else
    aborted in this process (:func:`drive`: roll back every touched node / the flag off everywhere).
    Returns the exit code of its final state; 2 with one error line for a usage error."""
    kind = driver.kind

    def handler(args: argparse.Namespace) -> int:
        try:
            wait_s = parse_duration(args.wait, "--wait")
            with open_store(args.run_dir, kind) as store:
                rec = pick(args, store, kind)
                if rec.state in TERMINAL:
                    hint = f" (`gpuobs {kind.group} kill {parse_variant(rec.version)[0]}` turns the flag off)" \
                        if kind.flags else ""
                    raise UsageError(f"{kind.noun} {rec.id} already ended {rec.state}; nothing to abort{hint}")
                code = ask_controller(args, kind, store, rec.id, args.reason, wait_s)
        except (UsageError, ConfigError, KeyError) as err:
            return fail(problem(err))
        if code is not None:
            return code
        return drive(driver, args, lambda ctl, rid: ctl.abort(rid, args.reason), rid=rec.id)
    handler.__doc__ = (f"Handler of ``{kind.group} abort``: {kind.abort_action} itself if no {kind.controller} "
                       "runs, else ask it and wait.")
    return handler
