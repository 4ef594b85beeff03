"""What ``gpuobs rollout`` and ``gpuobs flag`` share: the human-decision commands (``pause``,
``promote``, ``resume``'s pause-lifting and ``abort``'s hand-off to a running controller), the
``--operator`` default (:func:`default_operator`) and the running stack both drive
(:func:`running_stack`). Their report is :func:`gpuobs.rollout.report.report`.

Both groups keep a rollout store (SQLite, :class:`gpuobs.rollout.store.RolloutStore`) and one
controller lock (:class:`gpuobs.rollout.store.RunLock`) in the run directory, and record decisions
through :mod:`gpuobs.rollout.decisions`; they differ only in file names and nouns, which a
:class:`Kind` carries. A busy lock means a live controller: decisions are recorded for it to act on
at its next wait, and an abort is written to the store for it to carry out (the caller waits). A
free lock means nobody drives the rollout: the caller acts itself (``resume`` / ``abort`` drive the
controller in this process). Errors are :class:`gpuobs.rollout.model.UsageError` (no rollout
recorded, unknown ``--id``) or ``KeyError`` from the store; the group modules print them.
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

from gpuobs.cli.common import fail
from gpuobs.rollout import decisions
from gpuobs.rollout.model import EXIT_CODES, TERMINAL, UsageError
from gpuobs.rollout.store import RolloutStore, RunLock
from gpuobs.stack.state import StackState
from gpuobs.stack.supervisor import load_state


@dataclass(frozen=True)
class Kind:
    """What differs between release and flag rollouts in the decision commands.

    ``noun`` starts the printed lines ("rollout", "flag rollout"), ``group`` is the CLI group in
    hints (``gpuobs <group> resume``), ``db`` / ``lock`` are file names in the run directory,
    ``controller`` names the process that drives it, ``abort_action`` says what that process does on
    an abort."""

    noun: str
    group: str
    db: str
    lock: str
    controller: str
    abort_action: str


RELEASE = Kind("rollout", "rollout", "rollout.sqlite", "rollout.lock", "controller", "roll back")
FLAG = Kind("flag rollout", "flag", "flag.sqlite", "flag.lock", "flag controller", "pull the kill switch")


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
    """The record ``--id`` names, else the latest. Raises UsageError on an empty store, KeyError on an unknown id."""
    rec = store.get(args.id) if args.id else store.latest()
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
        rec = fn(store, pick(args, store, kind).id, args.operator, args.reason)
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
            return fail(err.args[0] if isinstance(err, KeyError) else err)
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
        lift(store, rec.id, args.operator, args.reason)
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
