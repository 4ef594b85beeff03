"""A rollout's report, read from its store: the text ``gpuobs rollout`` and ``gpuobs flag`` print
(state, reason, the assumptions the canary verdicts rest on, each once, pending decisions, stage table,
deploy log, fleet versions, operator decisions and the deciding canary verdict table) or, as JSON, the
rollout document that
:func:`gpuobs.reports.rollout.write_rollout_report` turns into HTML (``gpuobs report rollout --file``).

Release and flag rollouts share the format (their stores are both
:class:`~gpuobs.rollout.store.RolloutStore`). Times print as ``HH:MM:SSZ`` (UTC); epoch seconds in
the JSON. Errors: ``KeyError`` from the store for an unknown rollout id; a fleet that cannot say a
node's version shows ``unknown (<error>)`` for it instead of raising. Imports no plotting library.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from gpuobs.rollout.adapters.prometheus import BASELINE_SELECTOR, CANARY_SELECTOR
from gpuobs.rollout.interfaces import Fleet, FleetError
from gpuobs.rollout.model import EXIT_CODES, TERMINAL, RolloutSpec
from gpuobs.rollout.store import RolloutStore, StageRecord


def _ts(t: float | None) -> str:
    """Epoch seconds as ``HH:MM:SSZ`` (UTC); ``-`` for None."""
    return "-" if t is None else time.strftime("%H:%M:%SZ", time.gmtime(t))


def run_assumptions(stages: list[StageRecord]) -> list[str]:
    """Each distinct assumption of the stages' last canary verdicts once, in stage order (the
    verdict documents' ``assumptions``, :attr:`gpuobs.canary.verdict.Verdict.assumptions`): the run's
    header says them, so no look line, reason or verdict table repeats them."""
    out: list[str] = []
    for s in stages:
        for a in (s.verdict_doc or {}).get("assumptions") or []:
            if a not in out:
                out.append(a)
    return out


def report_doc(store: RolloutStore, rid: str, versions: dict[str, str] | None = None,
               prometheus: str | None = None, identity_label: str | None = None) -> dict[str, Any]:
    """Everything stored about rollout ``rid``, shaped so that ``gpuobs report rollout --file`` reads it
    too (gpuobs/reports/rollout.py: rollout_id, baseline_version, started_at/ended_at in epoch
    seconds, stages with index/share/nodes, final_verdict, selectors, prometheus). ``versions``:
    ``{host: version}`` as the fleet reports it now (``fleet_versions``; empty when not asked).
    ``assumptions``: :func:`run_assumptions`. A driver upgrade (its spec records ``gpu_models``) with
    ``identity_label`` given: the selectors are one GPU model's upgraded nodes and the nodes they were
    compared with (:func:`gpuobs.rollout.driver.report_selectors`; ``report_model`` names the model);
    a release or flag rollout's are the ``track`` labels. Raises KeyError for an unknown ``rid``."""
    rec = store.get(rid)
    spec = RolloutSpec.from_dict(rec.spec)
    stages, transitions = store.stages(rid), store.transitions(rid)
    previous = [n.previous for n in store.nodes(rid) if n.previous != rec.version]
    judged = [s for s in stages if s.verdict_doc]
    doc = {k: v for k, v in asdict(rec).items() if k != "spec"}
    sels = {"canary_selector": CANARY_SELECTOR, "baseline_selector": BASELINE_SELECTOR}
    if identity_label and rec.spec.get("gpu_models") and stages:
        from gpuobs.rollout.driver import report_selectors

        canary, baseline, model = report_selectors(rec.spec, stages, identity_label)
        sels = {"canary_selector": canary, "baseline_selector": baseline, "report_model": model}
    return {**doc, "exit_code": EXIT_CODES.get(rec.state), "spec": spec.to_dict(),
            "stages": [{**asdict(s), "index": s.idx, "share": f"{len(s.hosts) / len(spec.hosts):.0%}",
                        "nodes": s.hosts} for s in stages],
            "transitions": transitions, "deploys": store.deploys(rid), "gates": store.gates(rid),
            "events": store.events(rid),
            "fleet_versions": versions or {}, "rollout_id": rec.id,
            "baseline_version": (max(sorted(set(previous)), key=previous.count) if previous
                                 else _majority(rec.spec.get("versions_before"), rec.version)),
            "versions_before": rec.spec.get("versions_before") or {}, "stage_count": len(spec.stages),
            "started_at": rec.created_at, "ended_at": transitions[-1]["ts"] if rec.state in TERMINAL else None,
            "final_verdict": judged[-1].verdict_doc if judged else None, "prometheus": prometheus,
            "assumptions": run_assumptions(stages), **sels}


def _majority(versions: Any, exclude: str) -> str | None:
    """The most common version in ``{host: version}`` other than ``exclude`` (None if none)."""
    vals = [str(v) for v in (versions or {}).values() if v and v != exclude] if isinstance(versions, dict) else []
    return max(sorted(set(vals)), key=vals.count) if vals else None


def report(store: RolloutStore, rid: str, fleet: Fleet | None = None, as_json: bool = False,
           prometheus: str | None = None, group: str = "rollout", identity_label: str | None = None) -> str:
    """Rollout ``rid``'s report: state, reason, the assumptions (:func:`run_assumptions`, each once),
    stage table, deploy log, live fleet versions (when a fleet is given: its ``version(host)`` per
    planned host) and the deciding canary verdict table;
    or, with ``as_json``, all of it as one JSON object (:func:`report_doc`; ``prometheus`` is
    recorded there for the HTML report). ``group``: the command group whose ``resume``/``promote``
    a paused rollout's line names (``rollout``, ``flag`` or ``upgrade``); ``identity_label``: see
    :func:`report_doc`. Raises KeyError for an unknown ``rid``."""
    rec = store.get(rid)
    spec = RolloutSpec.from_dict(rec.spec)
    stages = store.stages(rid)
    versions: dict[str, str] = {}
    if fleet is not None:
        for h in spec.hosts:
            try:
                versions[h] = fleet.version(h)
            except FleetError as err:
                versions[h] = f"unknown ({err})"
    if as_json:
        return json.dumps(report_doc(store, rid, versions, prometheus, identity_label))
    n = len(spec.hosts)
    lines = [f"Rollout {rec.id}: {rec.state}" + (f" (exit {EXIT_CODES[rec.state]})" if rec.state in EXIT_CODES else ""),
             f"reason: {rec.reason or '-'}"]
    lines += [f"assumption: {a}" for a in run_assumptions(stages)]
    if rec.paused and rec.state not in TERMINAL:
        lines.append(f"PAUSED by {rec.paused.get('operator')} at {_ts(rec.paused.get('ts'))}: "
                     f"{rec.paused.get('reason')} (`gpuobs {group} resume` or `promote`)")
    if rec.promote_request and rec.state not in TERMINAL:
        lines.append(f"promote pending, by {rec.promote_request.get('operator')} at "
                     f"{_ts(rec.promote_request.get('ts'))}: {rec.promote_request.get('reason')}")
    rows = [("stage", "kind", "nodes", "hosts", "status", "looks", "verdict", "started", "window", "ended")]
    rows += [(f"{s.idx + 1}/{len(spec.stages)}", s.kind, f"{len(s.hosts)}/{n}", ",".join(s.hosts), s.status,
              str(s.looks), s.verdict or "-", _ts(s.started_at), _ts(s.analysis_start), _ts(s.ended_at))
             for s in stages]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    calls = [f"{d['hostname']} {d['previous']} -> {d['version']} ({d['purpose']})" for d in store.deploys(rid)]
    lines.append("deploys: " + ("; ".join(calls) if calls else "none"))
    if versions:
        lines.append("fleet now: " + ", ".join(f"{h} {v}" for h, v in versions.items()))
    for e in store.events(rid):
        stage = f" (stage {e['stage'] + 1}/{len(spec.stages)})" if e["stage"] >= 0 else ""
        lines.append(f"decision {_ts(e['ts'])}: {e['kind']} by {e['operator']}{stage}"
                     + (f": {e['reason']}" if e["reason"] else ""))
    judged = [s for s in stages if s.verdict_table]
    if judged:
        lines += [f"Deciding canary verdict (stage {judged[-1].idx + 1}/{len(spec.stages)}, "
                  f"look {judged[-1].looks}):", judged[-1].verdict_table]
    return "\n".join(lines)
