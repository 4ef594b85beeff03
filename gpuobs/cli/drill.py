"""``gpuobs drill``: failure drills on the running stack."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from gpuobs.cli.common import fail, int_range, pos_float, run_dir_default


def cmd_drill(args: argparse.Namespace) -> int:
    from gpuobs.drills import runner as drill
    from gpuobs.drills.catalogue import xid_drill
    from gpuobs.stack.supervisor import load_state

    state = load_state(Path(args.run_dir))
    if not state:  # `make up` in compose mode records the stack in compose.json instead
        from gpuobs.stack.compose import load_stack_state

        state = load_stack_state(Path(args.run_dir))
    if not state or not state.running:
        return fail(f"no running stack in {args.run_dir}; start one with `make up`")
    progress = None if args.json else (lambda m: print(f"  .. {m}", flush=True))
    if args.drill in REMEDIATION or args.drill == "remediation":
        return _remediation(args, state, progress)
    if args.drill == "soak":
        from gpuobs.drills.soak import run_soak

        res = run_soak(state, args.minutes, progress=progress)
        print(json.dumps(res.to_dict(), indent=2) if args.json else res.summary())
        return 0 if res.ok else 1
    try:
        if args.drill == "all":
            results = drill.run_all(state, progress, wait_resolve=not args.no_wait_resolve)
        else:
            spec = None
            if args.drill == "xid" and args.code != 48:
                spec = xid_drill(args.code)
            results = [drill.run_drill(state, args.drill, progress=progress, spec=spec,
                                       wait_resolve=not args.no_wait_resolve)]
    except (drill.DrillError, ValueError) as exc:
        return fail(str(exc))
    from gpuobs.core.files import atomic_write

    for r in results:  # kept for `gpuobs report drill <name>`
        atomic_write(Path(state.run_dir) / "drills" / f"{r.drill}-{int(r.injected_at)}.json",
                     json.dumps(r.to_dict(), indent=2))
    if args.json:
        print(json.dumps([r.to_dict() for r in results] if args.drill == "all" else results[0].to_dict(), indent=2))
    else:
        for r in results:
            print(drill.format_timeline(r))
        if len(results) > 1:
            print()
            print(drill.format_table(results))
    return 0 if all(r.ok for r in results) else 1


#: The remediation drills (gpuobs/drills/remediation.py); ``remediation`` runs them all in order.
REMEDIATION = ("remediate-xid", "manual-override", "remediate-kill", "remediate-fragmentation", "xid-storm")


def _remediation(args: argparse.Namespace, state, progress) -> int:
    from gpuobs.core.files import atomic_write
    from gpuobs.drills import remediation as rd

    names = REMEDIATION if args.drill == "remediation" else (args.drill,)
    try:
        results = rd.run_all(state, names, say=progress or (lambda m: None))
    except rd.RemediationDrillError as exc:
        return fail(str(exc))
    atomic_write(Path(state.run_dir) / "drills" / f"remediation-{int(time.time())}.json",
                 json.dumps([r.to_dict() for r in results], indent=2))
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        for r in results:
            print(f"{r.name} on {r.node}: {'PASS' if r.passed else 'FAIL'}")
            for c in r.checks:
                print(f"  ok   {c}")
            for p in r.problems:
                print(f"  FAIL {p}")
        print()
        print(rd.format_table(results))
    return 0 if all(r.passed for r in results) else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``drill`` group to ``sub``."""
    from gpuobs.drills.catalogue import DRILLS
    d = sub.add_parser("drill", help="failure drills on the running stack: inject, page, clear, resolve",
                       description="Inject a fault, wait for its alert to fire and reach its receiver, clear it, "
                                   "wait for the resolution. A progress line every 15 s says what is awaited. "
                                   "Expected durations per drill and profile: docs/drills.md.")
    d.add_argument("drill", choices=[*DRILLS, "all", "soak", *REMEDIATION, "remediation"],
                   help="drill name, all (lanes in parallel, then slo-burn), soak (watch a healthy fleet), or a "
                        "remediation drill / remediation (all five; the stack must run `--remediate enforce`)")
    d.add_argument("--minutes", type=pos_float, default=30.0, help="soak: minutes to watch (default 30)")
    d.add_argument("--code", type=int_range(1, 65535), default=48, help="xid drill: Xid code (default 48, DBE)")
    d.add_argument("--no-wait-resolve", action="store_true",
                   help="return once the fault is cleared: do not wait for (or check) the resolution, which on "
                        "the default profile can take the rules' full window, e.g. 10 min for ecc-dbe "
                        "(expected times: docs/drills.md)")
    d.add_argument("--run-dir", default=run_dir_default(),
                   help="run directory of the stack to drill (env GPUOBS_RUN_DIR; default %(default)s)")
    d.add_argument("--json", action="store_true", help="print the result(s) as JSON instead of the timeline")
    d.set_defaults(func=cmd_drill)
