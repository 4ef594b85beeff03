"""The documented Flagger Canary and MetricTemplate (deploy/kubernetes/flagger, the YAML of
docs/canary.md) driven through an emulation of Flagger v1.44.0's analysis loop (tests/fakes/flagger.py)
against a real ``gpuobs canary serve``: traffic only ramps with evidence, a healthy canary is promoted,
a regressed one rolled back, and an unjudged one ends (rolled back, never promoted) within a bounded
time instead of waiting in WaitingPromotion forever."""

from __future__ import annotations

import pytest

from tests.canary.controller_env import T0, Env, generated
from tests.fakes import flagger
from tests.fakes.canary_traffic import Traffic


def documented() -> tuple[dict, dict[str, dict]]:
    docs = generated("flagger/canary.yaml")
    canary = next(d for d in docs if d["kind"] == "Canary")
    templates = {d["metadata"]["name"]: d for d in docs if d["kind"] == "MetricTemplate"}
    return canary, templates


class Weighted:
    """Traffic whose canary share follows the weight Flagger sets (piecewise constant in time)."""

    def __init__(self, **kw):
        self.changes: list[tuple[float, int]] = [(T0 - 1, 0)]
        canary_sel = 'pod=~"vllm-[0-9a-z]+-[0-9a-z]+",pod!~"vllm-primary-.*"'
        self.traffic = Traffic(T0, share=self.share, tracks={canary_sel: "canary",
                                                             'pod=~"vllm-primary-.*"': "baseline"}, **kw)

    def share(self, t: float) -> float:
        w = 0
        for at, weight in self.changes:
            if at <= t:
                w = weight
        return w / 100.0

    def set(self, t: float, weight: int) -> None:
        self.changes.append((t, weight))


@pytest.fixture
def flagger_env(tmp_path):
    made: list[Env] = []

    def make(look_deadline_s: float = 60.0, **kw) -> tuple[Env, Weighted]:
        w = Weighted(**kw)
        e = Env(w.traffic, tmp_path / f"state{len(made)}", look_deadline_s=look_deadline_s)
        made.append(e)
        return e, w

    yield make
    for e in made:
        e.close()


def run(env: Env, w: Weighted, **kw) -> flagger.FlaggerRun:
    canary, templates = documented()
    return flagger.run_canary(canary, templates, lambda: env.url, env.clock.set, T0, w.set, **kw)


def test_documented_canary_has_what_the_crd_requires():
    canary, templates = documented()
    spec = canary["spec"]
    assert spec["targetRef"]["name"] and any(k in spec["analysis"] for k in ("iterations", "stepWeight", "stepWeights"))
    assert {h["type"] for h in spec["analysis"]["webhooks"]} == {
        "rollback", "rollout", "confirm-traffic-increase", "confirm-promotion"}
    assert spec["analysis"]["metrics"][0]["thresholdRange"] == {"min": 1}


def test_healthy_is_promoted(flagger_env):
    env, w = flagger_env()
    st = run(env, w)
    assert st.phase == "Succeeded", st.log


def test_regressed_is_rolled_back_by_the_rollback_hook(flagger_env):
    env, w = flagger_env(ttft_mult=1.35)
    st = run(env, w)
    assert st.phase == "Failed" and st.log[-1][1] == "rollback hook", st.log


def test_no_canary_data_never_ramps_and_ends_bounded(flagger_env):
    """The canary pods serve nothing (e.g. a broken route): the first step is granted, no later one,
    and the analysis ends at horizon + grace + threshold intervals, rolled back."""
    env, w = flagger_env(canary_from=T0 + 10_000)
    st = run(env, w)
    assert st.phase == "Failed" and st.max_weight_seen == 10, st.log
    ended = st.log[-1][0] - T0
    assert ended <= 600 + 30 + 4 * 30, st.log[-6:]


def test_prometheus_down_never_ramps_nor_promotes(flagger_env):
    env, w = flagger_env(fault=lambda t: "down")
    st = run(env, w)
    assert st.phase == "Failed" and st.max_weight_seen <= 10, st.log
    assert st.log[-1][0] - T0 <= 600 + 30 + 4 * 30


def test_prometheus_garbage_for_a_while_then_healthy(flagger_env):
    env, w = flagger_env(fault=lambda t: "garbage" if t < T0 + 120 else None)
    st = run(env, w)
    assert st.phase == "Succeeded", st.log


def test_waiting_promotion_is_bounded(flagger_env):
    """At maxWeight the promotion gate holds until PROMOTE; when the evidence stops coming (Prometheus
    dies while the canary waits) WaitingPromotion ends at horizon + grace: the run turns INCONCLUSIVE,
    the rollout hook answers 409, and Flagger's threshold rolls back. Never promoted, never forever."""
    env, w = flagger_env(rate=6.0, fault=lambda t: "down" if t >= T0 + 420 else None)
    st = run(env, w)
    events = [e for _, e in st.log]
    assert st.phase == "Failed" and "waiting promotion" in events and "promoted" not in events, st.log
    assert events[-1] == "threshold reached"
    assert st.log[-1][0] - T0 <= 600 + 30 + 4 * 30, st.log[-5:]


def test_serve_restart_mid_analysis(flagger_env):
    env, w = flagger_env()
    st = run(env, w, on_iteration=lambda i, t: env.restart() if i in (1, 3) else None)
    assert st.phase == "Succeeded" and env.restarts == 2, st.log


def test_metric_template_endpoint_is_prometheus_shaped(flagger_env):
    import requests

    env, w = flagger_env()
    canary, templates = documented()
    q = templates["gpuobs-canary-ok"]["spec"]["query"].replace("{{ namespace }}", "serving").replace(
        "{{ target }}", "vllm")
    r = requests.get(f"{env.url}/api/v1/query", params={"query": q}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success" and body["data"]["resultType"] == "vector"
    (sample,) = body["data"]["result"]
    assert sample["metric"]["__name__"] == "gpuobs_canary_ok" and sample["value"][1] == "1"
    bad = requests.get(f"{env.url}/api/v1/query", params={"query": "up"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["errorType"] == "bad_data"


def test_flaggers_start_up_check_vector_1_answers_one(flagger_env):
    """Flagger's prometheus provider checks a MetricTemplate's address with ``vector(1)`` and needs
    ``data.result[0].value[1] == 1`` (``IsOnline``); a constant answers itself, nothing is analysed."""
    import requests

    from gpuobs.canary.serve import constant_query

    env, _ = flagger_env()
    r = requests.get(f"{env.url}/api/v1/query", params={"query": "vector(1)"}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success" and body["data"]["resultType"] == "vector"
    (sample,) = body["data"]["result"]
    assert sample["metric"] == {} and float(sample["value"][1]) == 1.0 and sample["value"][1] == "1"
    assert env.srv.store.count() == 0  # no run was started by the check
    assert [constant_query(q) for q in (" vector( 1 ) ", "vector(0.5)", "vector(-2e3)", "vector(up)", "1",
                                        "vector(1) + vector(1)")] == ["1", "0.5", "-2000", None, None, None]
    bad = requests.get(f"{env.url}/api/v1/query", params={"query": "vector(up)"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["errorType"] == "bad_data"


@pytest.mark.parametrize("seed", [7, 8])
def test_a_canary_that_leans_harmful_is_not_ramped(flagger_env, seed):
    """+12% TTFT, just past the allowed 10%: confirm-traffic-increase holds the weight once a critical
    metric's harm-side z reaches runs.LEAN_Z, so the canary is rolled back at 10-20% of the traffic,
    never ramped towards 50% while the judge gathers evidence (before: 30-50%)."""
    env, w = flagger_env(ttft_mult=1.12, seed=seed)
    st = run(env, w)
    events = [e for _, e in st.log]
    assert st.phase == "Failed" and st.max_weight_seen <= 20, st.log
    assert "traffic increase held" in events
