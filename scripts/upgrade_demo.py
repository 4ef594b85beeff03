"""Checks the end of a driver upgrade demo (``make upgrade-good``, ``make drill-driver-regression``).

Usage: ``upgrade_demo.py RUN_DIR EXPECTED_STATE [REGRESSED_MODEL]``, or ``upgrade_demo.py --wait-history
RUN_DIR`` (sleep until the stack has run :data:`HISTORY_S`). Reads the run directory's latest
driver upgrade (``upgrade.sqlite``) and asks every serving node its driver and cordon state (admin API),
then prints what an operator would check and exits 0 when it is as expected, 1 otherwise:

* every batch's duration (from its start to its verdict) and their median;
* Succeeded: every serving node on the target driver, none cordoned;
* RolledBack with ``REGRESSED_MODEL`` (e.g. ``L40S``): the failed batch judged that model ROLLBACK (its
  deciding test with effect and interval printed) and no other model ROLLBACK; that model's nodes are
  back on their previous driver; every other node is in service, on the target driver if the upgrade
  reached it, else on its previous one (no other node was rolled back).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuobs.canary.verdict import deciding_line  # noqa: E402
from gpuobs.rollout.adapters.drivers import StackDriverFleet  # noqa: E402
from gpuobs.rollout.driver import short_model  # noqa: E402
from gpuobs.rollout.store import RolloutStore  # noqa: E402
from gpuobs.stack.supervisor import load_state  # noqa: E402


#: Pre-upgrade history a demo waits for on a fresh stack: the within-node design compares each upgraded
#: node with its own period before the upgrade (the L40S, the only one of its model, is judged that way
#: only), and a minute of it leaves the drift estimate too wide to decide within the batch timeout.
HISTORY_S = 300.0


def wait_history(run_dir: Path, seconds: float = HISTORY_S) -> None:
    """Sleep until the stack of ``run_dir`` has run ``seconds`` (its stack.json ``started_at``)."""
    import time

    state = load_state(run_dir)
    left = (state.started_at + seconds - time.time()) if state else 0.0
    if left > 0:
        print(f"waiting {left:.0f} s for {seconds / 60:.0f} min of pre-upgrade history (the within-node design "
              "compares each upgraded node with its own period before the upgrade)", flush=True)
        time.sleep(left)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--wait-history":
        wait_history(Path(argv[1]))
        return 0
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    run_dir, expected = Path(argv[0]), argv[1]
    regressed = argv[2] if len(argv) == 3 else None
    store = RolloutStore(run_dir / "upgrade.sqlite")
    rec = store.latest()
    if rec is None:
        print(f"demo FAILED: no driver upgrade recorded in {run_dir}")
        return 1
    fleet = StackDriverFleet(load_state(run_dir))
    models = rec.spec.get("gpu_models") or {}
    status = {h: fleet.status(h) for h in rec.spec["hosts"]}
    problems: list[str] = []
    stages = store.stages(rec.id)
    spans = [(st.ended_at or st.started_at) - st.started_at for st in stages]
    done = 0
    for st, span in zip(stages, spans):
        new = st.hosts[done:]
        done = len(st.hosts)
        print(f"batch {st.idx + 1}: +{len(new)} node(s) "
              f"({', '.join(sorted({short_model(models.get(h, '')) for h in new}))}; {len(st.hosts)} on the driver), "
              f"{st.status}, {span:.0f} s, verdict {st.verdict or '-'}")
    if spans:
        print(f"median time per batch: {statistics.median(spans):.0f} s over {len(spans)} batch(es)")
    if rec.state != expected:
        problems.append(f"ended {rec.state} ({rec.reason}), expected {expected}")
    cordoned = sorted(h for h, s in status.items() if s.get("cordoned"))
    if cordoned:
        problems.append(f"still cordoned: {', '.join(cordoned)}")
    before = {n.hostname: n.previous for n in store.nodes(rec.id)}
    if expected == "Succeeded":
        off = sorted(h for h, s in status.items() if s.get("driver_version") != rec.version)
        if off:
            problems.append(f"not on {rec.version}: {', '.join(off)}")
    elif regressed:
        failed = [st for st in stages if st.status == "failed"]
        by_model = (failed[-1].verdict_doc or {}).get("by_model", {}) if failed else {}
        judged = sorted(short_model(m) for m, v in by_model.items() if v == "ROLLBACK")
        if judged != [regressed]:
            problems.append(f"models judged ROLLBACK: {judged or 'none'}, expected [{regressed}]")
        for d in (failed[-1].verdict_doc or {}).get("deciding", []) if failed else []:
            print(f"deciding: {deciding_line(d)}")
        for h, s in status.items():
            mine = short_model(models.get(h, "")) == regressed
            drv = s.get("driver_version")
            if mine and h in before and drv != before[h]:
                problems.append(f"{h} ({regressed}) runs {drv}, not its previous {before[h]}")
            if not mine and h in before and drv != rec.version:
                problems.append(f"{h} ({short_model(models.get(h, ''))}) was rolled back to {drv}: only {regressed} "
                                "should be")
    print("drivers now: " + ", ".join(f"{h} {s.get('driver_version')} ({short_model(models.get(h, ''))})"
                                      for h, s in sorted(status.items())))
    if problems:
        print("demo FAILED: " + "; ".join(problems))
        return 1
    print(f"demo OK: driver upgrade {rec.id} ended {rec.state}"
          + (f"; only {regressed} was rolled back" if regressed else "") + ", as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
