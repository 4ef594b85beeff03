"""Live: what an incident costs, on the real Prometheus, Alertmanager and pager.

Two drills run at once on one stack (drill profile): the Xid drill on a serving node and the
collective-hang drill on the training node. Each ends with its incident's impact, measured by the pager
(gpuobs.pager.impact, which differences raw samples). The test recomputes every number it can from
Prometheus independently: serving counts from the counters' values at the window's two ends (instant
queries), and the training job's GPU-hours from ``increase()`` over the stall against the hang the
drill itself timed.
"""

from __future__ import annotations

import concurrent.futures
import re

import pytest

from gpuobs.drills import runner as drill
from gpuobs.promapi.prometheus import PromClient
from tests.conftest import live_stack

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from live_stack(tmp_path_factory, "impact", nodes=3, gpus=4, training_nodes=1, profile="drill",
                          timeout_s=120)


@pytest.fixture(scope="module")
def results(stack):
    claims = drill.Claims()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futs = {n: pool.submit(drill.run_drill, stack, n, claims) for n in ("xid", "collective-hang")}
        return {n: f.result() for n, f in futs.items()}


def _sum_at(prom: PromClient, expr: str, at: float) -> float:
    return prom.query(f"sum({expr})", at=at).scalar() or 0.0


def test_xid_drill_ends_with_its_incidents_impact_recomputed_from_prometheus(stack, results):
    res = results["xid"]
    assert res.ok, (res.problems, res.unexpected)
    imp = res.impact
    assert imp and "line" in imp, imp
    assert imp["join"] == "node" and imp["fleet"]["gpus_out"] == 1 and imp["fleet"]["gpus_total"] == 12
    (e,) = imp["serving"]
    assert e["node"] == res.hostname and e["requests"] > 0
    prom = PromClient(stack.urls.prometheus)
    t0, t1 = imp["window"]["start"], imp["window"]["end"]
    sel = f'job="vllm", node="{res.hostname}"'

    def delta(expr: str) -> float:
        return _sum_at(prom, expr, t1) - _sum_at(prom, expr, t0)
    assert e["requests"] == round(delta(f"vllm:request_success_total{{{sel}}}"))
    assert e["failed"] == round(delta(f'vllm:request_success_total{{{sel}, finished_reason="error"}}'))
    good = delta(f'vllm:time_to_first_token_seconds_bucket{{{sel}, le="2.5"}}')
    assert e["over_ttft_slo"] == round(max(0.0, delta(f"vllm:time_to_first_token_seconds_count{{{sel}}}") - good))
    assert e["goodput"] == round(max(0.0, good - e["failed"]))
    # The pager's own PromQL agrees up to increase()'s extrapolation to the window's edges.
    q = prom.query(imp["queries"]["requests"], at=t1).scalar()
    assert q == pytest.approx(e["requests"], rel=0.15)
    text = drill.format_timeline(res)
    assert f"impact (incident #{imp['incident']}): {imp['line']}" in text
    assert re.search(r"\d+ requests? failed", imp["line"]), imp["line"]  # "1 request failed", "0 requests failed"


def test_collective_hang_costs_the_jobs_gpu_hours(stack, results):
    res = results["collective-hang"]
    assert res.ok, (res.problems, res.unexpected)
    imp = res.impact
    assert imp and "line" in imp, imp
    (t,) = imp["training"]
    prom = PromClient(stack.urls.prometheus)
    assert t["gpus"] == 4 and t["ranks_stalled"] == 4, (t, res.cleared_s)
    t0, t1 = imp["window"]["start"], imp["window"]["end"]
    job = f'training_job="{t["training_job"]}"'
    steps = (prom.query(f"max(training_steps_total{{{job}}})", at=t1).scalar()
             - prom.query(f"max(training_steps_total{{{job}}})", at=t0).scalar())
    assert t["steps"] == round(steps)
    # The stall is the hang the drill timed itself, from the injection to the clear, give or take a
    # scrape at each end (the alert's startsAt came later: its rule waits for the hang).
    assert t["stalled_since"] < t0
    assert t["stalled_s"] == pytest.approx(res.cleared_s, abs=12), (t, res.cleared_s)
    assert t["gpu_hours_lost"] == pytest.approx(4 * t["stalled_s"] / 3600, abs=2e-3)
    # Steps lost at the job's own rate before the hang: the counter over the samples it has in the
    # minute before the stall (the stack is young: the series may be shorter than that).
    (before,) = [d for d in prom.query(f"training_steps_total{{{job}}}[60s]", at=t["stalled_since"]).series][:1]
    rate = (before.values[-1] - before.values[0]) / (before.timestamps[-1] - before.timestamps[0])
    assert t["steps_lost"] == pytest.approx(rate * t["stalled_s"], rel=0.3), (rate, t)
    assert f"{t['ranks_stalled']}/4 ranks stalled" in imp["line"] and "GPU-hours lost" in imp["line"]
