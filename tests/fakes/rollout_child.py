"""A rollout controller process for the ``kill -9`` tests (tests/rollout/test_rollout_resume.py).

``python -m tests.fakes.rollout_child RUN_DIR start|resume release|flag`` drives, on the run
directory's ``stack.json`` fleet, either a release rollout of 1.5.0 through the real admin API
(:class:`StackFleet`) or a flag rollout of spec_decode through the real flag adapter
(:class:`StackFlagFleet`: the flagd file, the nodes' /admin/flags confirmation, file_sd
relabelling). Signals are static and the analyzer is scripted by the number of canary targets in
the vLLM file_sd file: in ``start`` mode one canary node PROMOTEs and two HOLD forever (the parent
kills us there); in ``resume`` mode every look PROMOTEs. Real clock, 0.1 s looks.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from gpuobs.compat.inventory import InventoryRow
from gpuobs.rollout.adapters.flags import StackFlagFleet
from gpuobs.rollout.adapters.native import StackFleet
from gpuobs.rollout.controller import Controller
from gpuobs.rollout.flag import FlagController
from gpuobs.rollout.model import BudgetRow
from gpuobs.rollout.store import RolloutStore, RunLock
from gpuobs.stack.state import StackState
from tests.fakes.flag_rollout import FLAG, fspec
from tests.fakes.rollout import H100, make_verdict, spec


class StaticSignals:
    def __init__(self, hosts: list[str]):
        self.hosts = hosts

    def inventory(self) -> list[InventoryRow]:
        return [InventoryRow(h, H100, "550.54.15", 1) for h in self.hosts]

    def budget(self) -> list[BudgetRow]:
        return [BudgetRow({"slo": "ttft"}, 0.9)]

    def pages(self) -> set[str]:
        return set()


def main(run: Path, mode: str, kind: str) -> int:
    stack = StackState.from_dict(json.loads((run / "stack.json").read_text()))
    flag = kind == "flag"
    fleet = StackFlagFleet(stack, FLAG, confirm_s=5.0, poll_s=0.02) if flag else StackFleet(stack)
    targets = run / "prometheus" / "targets" / "vllm-nodes.json"

    def analyzers(horizon_s: float, interval_s: float):
        class Scripted:
            def analyze(self, start, end, state):
                canaries = sum(g["labels"].get("track") == "canary" for g in json.loads(targets.read_text()))
                verdict = "HOLD" if mode == "start" and canaries >= 2 else "PROMOTE"
                return make_verdict(verdict, start, end, horizon_s)
        return Scripted()

    lock = RunLock(run, "flag.lock" if flag else "rollout.lock")
    if not lock.acquire():
        print("lock busy", flush=True)
        return 2
    store = RolloutStore(run / ("flag.sqlite" if flag else "rollout.sqlite"))
    ctl = (FlagController if flag else Controller)(
        store, fleet, StaticSignals(fleet.hosts), analyzers, clock=time.time, sleep=time.sleep,
        out=lambda line: print(line, flush=True), poll_s=0.02)
    if mode == "start":
        rid = ctl.create((fspec if flag else spec)(hosts=tuple(fleet.hosts), interval_s=0.1, settle_s=0.0,
                                                    stage_timeout_s=600.0, bake_s=0.0)).id
    else:
        rid = store.latest().id
    rec = ctl.run(rid)
    print(f"final {rec.state}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))
