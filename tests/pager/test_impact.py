"""Impact of an incident (gpuobs.pager.impact): counters differenced from raw samples, the node's own
baseline, goodput and GPU-hours lost, the pod/node join, and the watcher's storage and failures.

The Prometheus here is a stub answering by metric name with hand-built raw samples (the arithmetic is
what is under test; tests/live/test_stack_drill.py recomputes a real incident's numbers from the real
Prometheus with ``increase()``)."""

from __future__ import annotations

import json
import time

import pytest

from gpuobs.core.fleet import FleetConfig
from gpuobs.pager import impact
from gpuobs.promapi.prometheus import PrometheusUnavailable, QueryResult, Sample, Series

T0 = 1_800_000_000.0  # incident start
STEP = 5.0


def counter(labels: dict, rate_fn, t_from: float, t_to: float, start_value: float = 0.0) -> Series:
    """Raw samples every STEP s of a counter whose per-second rate is ``rate_fn(t)``."""
    ts, vs, v, t = [], [], start_value, t_from
    while t <= t_to:
        ts.append(t)
        vs.append(v)
        v += rate_fn(t) * STEP
        t += STEP
    return Series(labels, tuple(ts), tuple(vs))


class StubProm:
    """Answers the queries :func:`impact.measure` sends: range selectors by metric name, the capacity
    and attribution ``group by`` queries from ``gpus``."""

    def __init__(self, series: dict[str, list[Series]], gpus: list[dict], total: int):
        self.series, self.gpus, self.total, self.asked = series, gpus, total, []

    def query(self, expr: str, at: float | None = None) -> QueryResult:
        self.asked.append((expr, at))
        if expr.startswith("count(group by"):
            return QueryResult("vector", samples=(Sample({}, float(self.total), at),))
        if expr.startswith("group by"):
            return QueryResult("vector", samples=tuple(Sample(g, 1.0, at) for g in self.gpus))
        name = expr.split("{", 1)[0]
        want_le = 'le="2.5"' in expr
        out = [s for s in self.series.get(name, []) if not want_le or s.labels.get("le") == "2.5"]
        if 'finished_reason="error"' in expr:
            out = [s for s in out if s.labels.get("finished_reason") == "error"]
        if "training_job=~" in expr:
            out = self.series.get("training_steps_total@all", out)
        return QueryResult("matrix", series=tuple(out))


CFG = impact.ImpactConfig(FleetConfig(), 2.5)
ENGINE = {"node": "gpu-node-00", "instance": "127.0.0.1:8000", "model_name": "llama", "engine": "0", "job": "vllm"}


def incident(start: float, end: float | None, nodes=("gpu-node-00",), gpus=("0",)) -> dict:
    import datetime as dt
    iso = dt.datetime.fromtimestamp(start, dt.timezone.utc).isoformat()
    return {"id": 1, "nodes": list(nodes), "gpus": list(gpus), "opened_at": start + 7,
            "state": "resolved" if end else "open", "resolved_at": end,
            "alerts": [{"startsAt": iso, "status": "resolved" if end else "firing", "labels": {}, "annotations": {}}]}


def test_increase_handles_resets_and_does_not_extrapolate():
    s = Series({}, (0.0, 10.0, 20.0, 30.0, 40.0), (100.0, 110.0, 5.0, 15.0, 15.0))
    assert impact.increase(s, 0.0, 40.0) == (10.0 + 5.0 + 10.0, 40.0)  # 110 -> 5 is a reset: +5
    assert impact.increase(s, 12.0, 40.0) == (5.0 + 10.0, 30.0)  # starts at the last sample <= t0 (t=10)
    assert impact.increase(Series({}, (0.0,), (1.0,)), 0.0, 9.0) == (0.0, 0.0)


def test_stalls_find_the_flat_stretch_and_keep_its_start_before_the_window():
    s = Series({}, tuple(float(t) for t in range(0, 200, 10)),
               tuple(float(min(t, 50) + max(0, t - 150)) for t in range(0, 200, 10)))
    # flat from the sample at 50 (last increase) to the sample at 160 (next increase)
    assert impact.stalls(s, 100.0, 190.0, 0.0, 60.0) == [(50.0, 160.0)]
    assert impact.stalls(s, 170.0, 190.0, 0.0, 60.0) == []  # over before the window
    assert impact.step_gap(s, 0.0, 50.0) == 10.0


def serving_series(err_rate_during: float, slow_share_during: float, base_rate: float = 10.0,
                   dur: float = 300.0) -> dict[str, list[Series]]:
    b0 = T0 - 900
    during = lambda t: t >= T0  # noqa: E731
    def reason(r):
        def f(t):
            if r == "error":
                return (err_rate_during if during(t) else 0.01) * base_rate
            return (1 - (err_rate_during if during(t) else 0.01)) * base_rate
        return f
    succ = [counter({**ENGINE, "finished_reason": r}, reason(r), b0, T0 + dur) for r in ("stop", "error")]
    good = counter({**ENGINE, "le": "2.5"}, lambda t: base_rate * (1 - (slow_share_during if during(t) else 0.0)),
                   b0, T0 + dur)
    count = counter(ENGINE, lambda t: base_rate, b0, T0 + dur)
    return {"vllm:request_success_total": succ, "vllm:time_to_first_token_seconds_bucket": [good],
            "vllm:time_to_first_token_seconds_count": [count]}


def test_serving_numbers_against_the_nodes_own_baseline():
    prom = StubProm(serving_series(err_rate_during=0.21, slow_share_during=0.5), [{"node": "gpu-node-00", "gpu": "0"}], 32)
    doc = impact.measure(prom, CFG, incident(T0, T0 + 300), now=T0 + 400)
    assert doc["window"] == {"start": T0, "end": T0 + 300, "seconds": 300.0}  # resolved: ends at resolution
    (e,) = doc["serving"]
    assert e["requests"] == 3000 and e["failed"] == 630
    assert e["failed_excess"] == 600  # 630 - 1% of 3000 at the node's own baseline
    assert e["over_ttft_slo"] == 1500 and e["over_ttft_slo_excess"] == 1500
    # good = TTFT-good - failed: baseline (10 - 0.1)/s; during 1500 - 630 = 870 of 2970 expected
    assert e["baseline_goodput_per_s"] == pytest.approx(9.9)
    assert e["goodput_lost"] == 2970 - 870 and e["goodput_lost_per_s"] == pytest.approx(7.0)
    assert doc["fleet"] == {"gpus_total": 32, "gpus_out": 1, "capacity_out_ratio": 0.0312}
    assert doc["join"] == "node" and "joined by node" in doc["line"]
    assert "630 requests failed (600 above baseline)" in doc["line"] and "goodput lost 2,100 requests" in doc["line"]
    assert doc["totals"]["requests_failed"] == 630 and doc["totals"]["goodput_lost"] == 2100
    assert 'finished_reason="error"' in doc["queries"]["failed"] and "[300s]" in doc["queries"]["failed"]


def test_healthy_engine_loses_nothing():
    prom = StubProm(serving_series(err_rate_during=0.01, slow_share_during=0.0), [{"node": "gpu-node-00", "gpu": "0"}], 8)
    (e,) = impact.measure(prom, CFG, incident(T0, None), now=T0 + 300)["serving"]
    assert (e["failed_excess"], e["over_ttft_slo"], e["goodput_lost"]) == (0, 0, 0)


def test_pod_attribution_joins_only_the_engine_whose_pod_owns_the_gpu():
    series = serving_series(0.01, 0.0)
    other = {**ENGINE, "instance": "127.0.0.1:8001", "engine": "1", "pod": "other-engine"}
    series["vllm:request_success_total"] = [
        *[Series({**s.labels, "pod": "vllm-a"}, s.timestamps, s.values) for s in series["vllm:request_success_total"]],
        counter({**other, "finished_reason": "stop"}, lambda t: 1.0, T0 - 900, T0 + 60)]
    attr = [{"node": "gpu-node-00", "gpu": "0", "pod": "nvidia-dcgm-exporter-x", "container": "nvidia-dcgm-exporter",
             "exported_pod": "vllm-a", "exported_namespace": "serving", "exported_container": "vllm"}]
    doc = impact.measure(StubProm(series, attr, 8), CFG, incident(T0, None), now=T0 + 60)
    assert doc["join"] == "pod" and doc["pods"] == [{"gpu": "0", "namespace": "serving", "pod": "vllm-a", "container": "vllm"}]
    assert [e["pod"] for e in doc["serving"]] == ["vllm-a"]
    assert "joined by node" not in doc["line"]


def test_training_hang_costs_the_jobs_gpus_times_the_stall():
    ranks = []
    for node in ("gpu-node-03", "gpu-node-04"):
        for r in range(8):
            lab = {"node": node, "rank": f"{node[-1]}{r}", "training_job": "pretrain"}
            # 0.5 steps/s, hung from 120 s before the alert (its rule waits for the hang) until 240 s in
            ranks.append(counter(lab, lambda t: 0.0 if T0 - 120 <= t < T0 + 240 else 0.5, T0 - 900, T0 + 300))
    prom = StubProm({"training_steps_total": ranks[:8], "training_steps_total@all": ranks},
                    [{"node": "gpu-node-03", "gpu": str(g)} for g in range(8)], 40)
    doc = impact.measure(prom, CFG, incident(T0, T0 + 300, nodes=("gpu-node-03",), gpus=()), now=T0 + 300)
    (t,) = doc["training"]
    assert t["gpus"] == 16 and t["ranks_on_incident_nodes"] == 8 and t["ranks_stalled"] == 16
    assert t["baseline_steps_per_s"] == pytest.approx(0.5) and t["steps"] == 30
    assert t["stalled_since"] == T0 - 120  # the sample that last showed a step
    assert t["stalled_s"] == pytest.approx(360.0, abs=STEP) and t["steps_lost"] == pytest.approx(180, abs=3)
    assert t["gpu_hours_lost"] == pytest.approx(16 * 360 / 3600, abs=0.03)
    assert doc["fleet"]["gpus_out"] == 8  # no gpu label: every GPU of the node
    assert "16/16 ranks stalled" in doc["line"] and "GPU-hours lost" in doc["line"]


def test_slow_steps_are_not_a_stall():
    lab = {"node": "gpu-node-03", "rank": "0", "training_job": "big"}
    # one step every 90 s: flat stretches of 90 s are the job's normal pace, not a stall
    slow = counter(lab, lambda t: 1.0 / STEP if int(t - T0) % 90 == 0 else 0.0, T0 - 900, T0 + 300)
    prom = StubProm({"training_steps_total": [slow], "training_steps_total@all": [slow]},
                    [{"node": "gpu-node-03", "gpu": "0"}], 8)
    (t,) = impact.measure(prom, CFG, incident(T0, T0 + 300, nodes=("gpu-node-03",), gpus=()), now=T0 + 300)["training"]
    assert t["ranks_stalled"] == 0 and t["gpu_hours_lost"] == 0.0 and t["stall_min_s"] >= 360


def test_an_incident_without_nodes_measures_only_the_fleet():
    prom = StubProm({}, [], 32)
    doc = impact.measure(prom, CFG, incident(T0, None, nodes=(), gpus=()), now=T0 + 60)
    assert doc["join"] == "none" and doc["serving"] == [] and doc["fleet"]["gpus_out"] == 0
    assert len(prom.asked) == 1


def test_node_names_are_quoted_for_promql():
    prom = StubProm({}, [], 1)
    impact.measure(prom, CFG, incident(T0, None, nodes=('a.b"c',), gpus=()), now=T0 + 60)
    assert any('node=~"a\\\\.b\\"c"' in q for q, _ in prom.asked), prom.asked


class MemStore:
    def __init__(self, inc):
        self.inc, self.docs = inc, {}

    def incident(self, iid):
        return {**self.inc, "impact": self.docs.get(iid)}

    def record_impact(self, iid, doc):
        self.docs[iid] = json.loads(json.dumps(doc))

    def impact_due(self, now, every_s, since):
        return [1]


def test_watcher_keeps_the_last_numbers_when_prometheus_fails():
    store = MemStore(incident(T0, None))
    calls = []

    def fn(inc, now):
        calls.append(now)
        if len(calls) > 1:
            raise PrometheusUnavailable("http://127.0.0.1:1", 2, "ConnectionError")
        return {"measured_at": now, "line": "ok"}

    w = impact.ImpactWatcher(store, fn)
    assert w.check(T0 + 10) == [1] and store.docs[1] == {"measured_at": T0 + 10, "line": "ok"}
    w.check(T0 + 50)
    assert store.docs[1]["line"] == "ok" and store.docs[1]["error_at"] == T0 + 50
    assert "127.0.0.1:1" in store.docs[1]["error"]


def test_store_measures_open_incidents_periodically_and_a_resolved_one_once_more(tmp_path):
    from gpuobs.pager.store import PageStore
    from tests.pager.test_incidents import _payload

    store = PageStore(tmp_path / "p.sqlite")
    store.deliver("page", _payload())
    (iid,) = [i["id"] for i in store.incidents()]
    now = store.incident(iid)["opened_at"]
    assert store.impact_due(now, 30, now - 86400) == [iid]
    store.record_impact(iid, {"measured_at": now, "line": "x"})
    assert store.impact_due(now + 10, 30, now - 86400) == []
    assert store.impact_due(now + 31, 30, now - 86400) == [iid]
    assert store.incident(iid)["impact"] == {"measured_at": now, "line": "x"}
    assert store.incidents()[0]["impact"]["line"] == "x"
    time.sleep(0.05)
    store.deliver("page", _payload("resolved"))
    resolved_at = store.incident(iid)["resolved_at"]
    assert resolved_at > now
    assert store.impact_due(resolved_at + 1, 30, now - 86400) == [iid]  # measured before the resolution
    store.record_impact(iid, {"measured_at": resolved_at + 1, "line": "final"})
    assert store.impact_due(resolved_at + 100, 30, now - 86400) == []  # final: never again
    store.close()


def test_a_young_series_does_not_take_its_stall_for_its_pace():
    # three steps seen, then a 40 s hang: two gaps (5 s and 40 s) cannot say the pace; the scrape can
    s = Series({}, (0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0, 55.0),
               (1.0, 3.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 7.0, 9.0))
    assert impact.step_gap(s, 0.0, 55.0) == 5.0


def test_a_counter_relabelled_mid_window_counts_once_and_whole():
    # the same engine's counter: 0..100 without a track label, 105..200 with track="canary", then back
    a = Series({**ENGINE, "finished_reason": "stop"}, (0.0, 50.0, 100.0), (0.0, 50.0, 100.0))
    b = Series({**ENGINE, "finished_reason": "stop", "track": "canary"}, (105.0, 150.0, 200.0), (105.0, 150.0, 200.0))
    c = Series({**ENGINE, "finished_reason": "stop"}, (205.0, 250.0), (205.0, 250.0))
    (m,) = impact.merge([a, b, c], ("finished_reason",))
    assert impact.increase(m, 0.0, 250.0) == (250.0, 250.0)
    assert sum(impact.increase(s, 0.0, 250.0)[0] for s in (a, b, c)) == 240.0  # per series: each switch lost


def _notice(start: float, end: float) -> dict:
    import datetime as dt
    iso = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat()  # noqa: E731
    return impact.of_alert({"labels": {"alertname": "RolloutRolledBack"}, "startsAt": iso(end + 5),
                            "annotations": {"affected_nodes": "gpu-node-00", "affected_since": iso(start),
                                            "affected_until": iso(end)}}, end + 5)


def test_a_rollout_notice_is_measured_on_its_stage_and_takes_no_capacity_out():
    prom = StubProm(serving_series(0.21, 0.5), [{"node": "gpu-node-00", "gpu": "0"}], 32)
    doc = impact.measure(prom, CFG, _notice(T0, T0 + 300), now=T0 + 600)
    assert doc["window"]["start"] == T0 and doc["window"]["end"] == T0 + 300  # the stage, not the notice
    assert doc["serving"][0]["failed"] == 630
    assert doc["fleet"]["gpus_out"] == 0 and "capacity out" not in doc["line"]  # the stage kept serving


def test_goodput_within_traffic_noise_is_said_so_and_a_short_baseline_is_no_baseline():
    series = serving_series(0.01, 0.0)
    prom = StubProm(series, [{"node": "gpu-node-00", "gpu": "0"}], 8)
    (e,) = impact.measure(prom, CFG, incident(T0, T0 + 300), now=T0 + 400)["serving"]
    assert e["goodput_lost"] <= e["goodput_lost_noise"] == round(2 * (9.9 * 300) ** 0.5)
    doc = impact.measure(prom, CFG, incident(T0, T0 + 300), now=T0 + 400)
    assert "no goodput lost beyond traffic noise (+-109 requests)" in doc["line"]
    young = {k: [impact.Series(s.labels, *zip(*[(t, v) for t, v in zip(s.timestamps, s.values) if t >= T0 - 30]))
                 for s in v] for k, v in series.items()}
    doc = impact.measure(StubProm(young, [{"node": "gpu-node-00", "gpu": "0"}], 8), CFG, incident(T0, T0 + 300), T0 + 400)
    (e,) = doc["serving"]
    assert e["baseline_seconds"] == 30.0 and e["goodput_lost"] is None and e["failed_excess"] is None
    assert "goodput lost: no baseline" in doc["line"] and "above baseline" not in doc["line"]
    assert "[30s] offset 300s" in doc["queries"]["baseline_goodput_per_s"]  # the span the pager used


def test_stack_next_steps_name_the_run_dir_unless_it_is_makes():
    from gpuobs.cli.stack import next_steps

    assert next_steps(".run") == "Try: make drill-xid    Stop: make down"
    assert next_steps("/tmp/x") == "Try: gpuobs drill xid --run-dir /tmp/x    Stop: gpuobs stack down --run-dir /tmp/x"
