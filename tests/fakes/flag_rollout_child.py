"""A flag rollout controller process for the ``kill -9`` test (tests/rollout/test_flag_resume.py).

``python -m tests.fakes.flag_rollout_child RUN_DIR start|resume``: drives a rollout of spec_decode on
the run directory's ``stack.json`` fleet through the real flag adapter (:class:`StackFlagFleet`: the
flagd file, the nodes' /admin/flags confirmation, file_sd relabelling), with static Prometheus
signals and an analyzer scripted by the number of canary targets: in ``start`` mode one canary node
PROMOTEs and two HOLD forever (the parent kills us there); in ``resume`` mode every look PROMOTEs.
Real clock, 0.1 s looks.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from gpuobs.rollout.adapters.flags import StackFlagFleet
from gpuobs.rollout.flag import FlagController
from gpuobs.rollout.store import RolloutStore, RunLock
from gpuobs.stack.state import StackState
from tests.fakes.flag_rollout import FLAG, fspec
from tests.fakes.rollout import make_verdict
from tests.fakes.rollout_child import StaticSignals


def main(run: Path, mode: str) -> int:
    stack = StackState.from_json(json.loads((run / "stack.json").read_text()))
    fleet = StackFlagFleet(stack, FLAG, confirm_s=5.0, poll_s=0.02)
    targets = run / "prometheus" / "targets" / "vllm-nodes.json"

    def analyzers(horizon_s: float, interval_s: float):
        class Scripted:
            def analyze(self, start, end, state):
                canaries = sum(g["labels"].get("track") == "canary" for g in json.loads(targets.read_text()))
                verdict = "HOLD" if mode == "start" and canaries >= 2 else "PROMOTE"
                return make_verdict(verdict, start, end, horizon_s)
        return Scripted()

    lock = RunLock(run, "flag.lock")
    if not lock.acquire():
        print("lock busy", flush=True)
        return 2
    store = RolloutStore(run / "flag.sqlite")
    ctl = FlagController(store, fleet, StaticSignals(fleet.hosts), analyzers, clock=time.time, sleep=time.sleep,
                         out=lambda line: print(line, flush=True), poll_s=0.02)
    if mode == "start":
        rid = ctl.create(fspec(hosts=tuple(fleet.hosts), interval_s=0.1, settle_s=0.0, stage_timeout_s=600.0,
                               bake_s=0.0)).id
    else:
        rid = store.latest().id
    rec = ctl.run(rid)
    print(f"final {rec.state}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
