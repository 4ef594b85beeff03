"""Canary analyzer end to end against a fake Prometheus fed with the simulator's latency model."""

from __future__ import annotations

import re

import numpy as np
import pytest

from gpuobs.canary.analyzer import AnalysisState, Analyzer
from gpuobs.canary.config import (
    ConfigError,
    load_config,
    parse_config,
    parse_duration,
    parse_selector,
)
from gpuobs.canary.sequential import group_sequential_boundaries, planned_looks
from gpuobs.canary.stats import HIGH, INCONCLUSIVE, LOW, NODATA, PASS
from gpuobs.canary.verdict import HOLD, PROMOTE, ROLLBACK, decide
from gpuobs.promapi.prometheus import (
    PromClient,
    PrometheusQueryError,
    PrometheusUnavailable,
)
from tests.fakes.prometheus import FakePrometheus, FleetData, fleet, ok, vector

CANARY, BASELINE = 'track="canary"', 'track="baseline"'
START, END = 10_000.0, 10_300.0  # a 5 minute window: half of the default 10 minute horizon


def analyze(data, start=START, end=END, state=None, config=None):
    with FakePrometheus(data) as fp:
        analyzer = Analyzer(PromClient(fp.url, retries=0), config or load_config(), CANARY, BASELINE)
        return analyzer.analyze(start, end, state), fp.requests


def row(verdict, name):
    return next(m for m in verdict.metrics if m.name == name)


def test_healthy_canary_with_enough_traffic_is_promoted():
    v, _ = analyze(fleet(n_c=2400, n_b=45_600, err_b=20))
    assert v.verdict == "PROMOTE" and v.exit_code == 0
    ttft = row(v, "ttft")
    assert ttft.classification in ("Pass", "Low") and abs(ttft.effect) < 0.05
    lo, hi = ttft.interval
    assert lo < ttft.effect < hi and hi < 0.10
    assert row(v, "error_ratio").classification == "Pass"
    assert row(v, "itl").evidence["n_eff_canary"] == 2400  # ITL counted per request, not per token


def test_twenty_percent_ttft_regression_rolls_back_with_the_effect_in_its_interval():
    v, _ = analyze(fleet(ttft_mult=1.2))
    assert v.verdict == "ROLLBACK" and v.exit_code == 1
    ttft = row(v, "ttft")
    assert ttft.classification == "High" and ttft.harmful
    assert ttft.interval[0] < 0.2 < ttft.interval[1] and ttft.interval[0] > 0
    assert ttft.effect == pytest.approx(0.2, abs=0.06)
    assert ttft.canary["p99"] > ttft.baseline["p99"]
    assert ttft.evidence["z"] > ttft.evidence["boundary"]
    # reasons: one short line per deciding test, its effect and interval, nothing else
    harmful = [t["test"] for t in ttft.tests if t.get("harmful")]
    assert [d["test"] for d in v.deciding] == harmful and "location" in harmful
    loc = next(t for t in ttft.tests if t["test"] == "location")
    assert v.reasons[0] == (f"ttft: High ({loc['effect'] * 100:+.1f}% [{loc['interval'][0] * 100:+.1f}%, "
                            f"{loc['interval'][1] * 100:+.1f}%], between-node)")
    assert len(v.reasons) == len(harmful) and all(len(r) < 75 for r in v.reasons)
    assert v.to_dict()["deciding"][0]["metric"] == "ttft"


def test_error_regression_rolls_back():
    v, _ = analyze(fleet(n_c=2400, n_b=45_600, err_c=30, err_b=20))  # 1.25% vs 0.04%
    er = row(v, "error_ratio")
    assert er.classification == "High" and v.verdict == "ROLLBACK"
    assert er.canary["ratio"] == pytest.approx(30 / 2400) and er.interval[0] > 0
    assert er.evidence["log_e"] >= er.evidence["threshold"]
    assert v.deciding[0]["test"] is None and v.reasons[0].startswith("error_ratio: High (+")


def test_too_little_data_is_hold_never_promote():
    v, _ = analyze(fleet(n_c=50, n_b=950))
    assert v.verdict == "HOLD" and v.exit_code == 3
    assert row(v, "ttft").classification == "NoData"
    assert "50 requests" in row(v, "ttft").reason and "needs 100" in row(v, "ttft").reason


def test_empty_canary_results_are_hold():
    data = fleet()
    del data.histograms["canary"]
    del data.counters["canary"]
    v, _ = analyze(data)
    assert v.verdict == "HOLD"
    assert row(v, "ttft").classification == "NoData" and "canary" in row(v, "ttft").reason
    assert row(v, "error_ratio").classification == "NoData"


def test_nan_results_are_hold():
    data = fleet(n_c=2400, n_b=45_600)

    def responder(endpoint, params):
        status, body = data(endpoint, params)
        if "time_to_first_token" in params["query"][0] and 'track="canary"' in params["query"][0]:
            for sample in body["data"]["result"]:
                sample["value"][1] = "NaN"
        return status, body

    v, _ = analyze(responder)
    assert v.verdict == "HOLD" and row(v, "ttft").reason == "NaN in the canary result"


def test_series_metrics_are_advisory_and_missing_ones_do_not_block():
    v, _ = analyze(fleet(n_c=2400, n_b=45_600, err_b=20, series=False))
    assert v.verdict == "PROMOTE"
    assert row(v, "power_per_token").classification == "NoData"
    assert any("power_per_token" in w for w in v.warnings)


def test_queries_carry_selectors_window_and_evaluation_time():
    _, requests = analyze(fleet())
    queries = [r["params"]["query"][0] for r in requests]
    assert all(CANARY in q or BASELINE in q for q in queries)
    ttft_q = [q for q in queries if "time_to_first_token" in q]
    # a histogram's first sample is read from its _count: one series per node, not one per bucket
    assert ttft_q[0] == ('min(min_over_time(timestamp(vllm:time_to_first_token_seconds_count{job=~"vllm|.*vllm.*",'
                         'track="canary"})[315s:15s]))')
    assert ttft_q[2] == ('sum by (le, instance) (increase(vllm:time_to_first_token_seconds_bucket{job=~"vllm|.*vllm.*",'
                         'track="canary"}[300s]))')
    assert any('finished_reason="error"' in q for q in queries)
    instant = [r for r in requests if r["endpoint"] == "query"]
    # every instant query is answered at the time asked: VictoriaMetrics would otherwise move a look
    # ending now back by its -search.latencyOffset, past the windows cut at the first samples
    assert instant and all(r["params"].get("nocache") == ["1"] for r in instant)
    assert all("nocache" not in r["params"] for r in requests if r["endpoint"] == "query_range")
    # the look's queries at its end; the pre-stage ones (within-node design) at the stage's start
    pre = [r["params"]["query"][0] for r in instant if r["params"]["time"] == ["10000.000"]]
    assert all(r["params"]["time"] == ["10300.000"] for r in instant if r["params"]["query"][0] not in pre)
    assert [q for q in pre if "increase" in q] == [
        f'sum by (le, instance) (increase(vllm:{m}_bucket{{job=~"vllm|.*vllm.*",{BASELINE}}}[7200s]))'
        for m in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds")]
    ranged = [r for r in requests if r["endpoint"] == "query_range"]
    assert ranged and all(r["params"]["step"] == ["15"] for r in ranged)


def _increase_windows(requests, history=False):
    """The increase() windows of the look's own queries (``history``: of the baseline-history ones,
    the only queries reaching further back than the look: Analyzer._node_history)."""
    out = set()
    for r in requests:
        q = r["params"]["query"][0]
        if "increase(" not in q or r["params"].get("time") != [f"{END:.3f}"]:  # not the pre-stage queries
            continue
        w = re.search(r"\[(\d+)s\]", q).group(1)
        if (int(w) > END - START) == history:
            out.add(w)
    return out


def test_the_baseline_nodes_spread_is_also_read_over_node_history():
    """The baseline's per-node buckets over node_history (30 min) before the look's window: one more
    query, ``sum by (le, instance)`` on the baseline only, cut at its first sample + one step; the
    location test names its source. node_history 0 turns it off."""
    data = fleet(n_c=2400, n_b=45_600, err_b=20)
    data.first_sample = {"canary": START - 3600.0, "baseline": START - 3600.0}
    v, reqs = analyze(data)
    hist = [r["params"]["query"][0] for r in reqs if "increase(" in r["params"]["query"][0]
            and re.search(r"\[(\d+)s\]", r["params"]["query"][0]).group(1) == "2100"]
    assert hist == ['sum by (le, instance) (increase(vllm:time_to_first_token_seconds_bucket{job=~"vllm|.*vllm.*",'
                    'track="baseline"}[2100s]))',
                    'sum by (le, instance) (increase(vllm:inter_token_latency_seconds_bucket{job=~"vllm|.*vllm.*",'
                    'track="baseline"}[2100s]))',
                    'sum by (le, instance) (increase(vllm:e2e_request_latency_seconds_bucket{job=~"vllm|.*vllm.*",'
                    'track="baseline"}[2100s]))']
    loc = next(t for t in row(v, "ttft").tests if t["test"] == "location")
    assert loc["node_tau_source"].startswith("nodes with history, 7 df")
    assert row(v, "ttft").evidence["node_history_s"] == 2100.0
    # a baseline born 10 min before the look: the history starts one step after its first sample
    data.first_sample = {"canary": START - 3600.0, "baseline": START - 600.0}
    _, reqs = analyze(data)
    assert _increase_windows(reqs, history=True) == {str(round(END - (START - 600.0 + 15.0)))}
    # off
    v, reqs = analyze(data, config=load_config().with_node_history(0.0))
    assert not _increase_windows(reqs, history=True)
    assert next(t for t in row(v, "ttft").tests if t["test"] == "location")["node_tau_source"].startswith("nodes,")


def test_a_look_never_reads_counters_from_before_the_first_scrape():
    """Series born inside the window (a fresh canary and baseline): every increase() starts one step
    less 1 s (14 s) after the later side's first sample, so Prometheus (2.x closed, 3.x left-open
    ranges) and VictoriaMetrics all see a sample before the window and the second one inside it
    (gpuobs.canary.analyzer docstring); the stage's time fraction still counts from START."""
    data = fleet(n_c=2400, n_b=45_600, err_b=20)
    data.first_sample = {"canary": START + 60.0, "baseline": START + 90.0}
    v, reqs = analyze(data)
    assert _increase_windows(reqs) == {str(round(END - (START + 90.0 + 14.0)))}
    assert all(row(v, m).data_start == START + 104.0 for m in ("ttft", "itl", "error_ratio", "e2e"))
    assert row(v, "kv_cache_usage").data_start is None
    assert v.time_fraction == pytest.approx((END - START) / 600)
    assert v.verdict == "PROMOTE"


def test_series_older_than_the_window_keep_the_whole_window():
    data = fleet(n_c=2400, n_b=45_600, err_b=20)
    data.first_sample = {"canary": START - 15.0, "baseline": START - 3600.0}
    v, reqs = analyze(data)
    assert _increase_windows(reqs) == {"300"} and row(v, "ttft").data_start == START


def test_a_canary_first_scraped_too_recently_is_hold_naming_the_side():
    data = fleet(n_c=2400, n_b=45_600, err_b=20)
    data.first_sample = {"canary": END - 0.5}
    v, reqs = analyze(data)
    assert v.verdict == "HOLD" and not _increase_windows(reqs)
    reason = row(v, "ttft").reason
    assert "canary's first vllm:time_to_first_token_seconds_count sample" in reason and "just after it" in reason
    assert "canary's first vllm:request_success_total sample" in row(v, "error_ratio").reason


def test_unreachable_prometheus_raises_instead_of_a_verdict():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    analyzer = Analyzer(PromClient(f"http://127.0.0.1:{port}", retries=0), load_config(), CANARY, BASELINE)
    with pytest.raises(PrometheusUnavailable):
        analyzer.analyze(START, END)


def test_rejected_query_raises():
    body = {"status": "error", "errorType": "bad_data", "error": "unknown function"}
    with FakePrometheus(lambda ep, p: (400, body)) as fp:
        with pytest.raises(PrometheusQueryError):
            Analyzer(PromClient(fp.url), load_config(), CANARY, BASELINE).analyze(START, END)


def test_state_records_looks_and_matches_the_stateless_schedule():
    cfg = load_config().select(["ttft"])
    state = AnalysisState()
    verdicts = []
    for k in range(1, 6):  # looks every 30 s, traffic proportional to time
        data = fleet(seed=k, n_c=60 * k, n_b=1140 * k, series=False)
        verdicts.append(analyze(data, START, START + 30 * k, state, cfg)[0])
    looks = state.looks["ttft.location"]  # one schedule per test of the metric (issue 18)
    assert [round(t * 600) for t, _ in looks] == [60, 90, 120, 150]  # the first look had 60 < 100 requests
    assert verdicts[0].metrics[0].classification == "NoData"
    # with steady traffic the recorded schedule gives (nearly) the stateless boundary
    last = next(t for t in verdicts[-1].metrics[0].tests if t["test"] == "location")
    times, infos = planned_looks(150, 30, 600, 300, 100, last["look"]["info"])
    stateless = group_sequential_boundaries(cfg.spending.with_alpha(last["alpha"]), times, infos)[-1]
    assert last["boundary_normal"] == pytest.approx(stateless, abs=0.05)
    restored = AnalysisState.from_dict(state.to_dict())
    assert restored.looks == state.looks
    with pytest.raises(ValueError, match="earlier"):
        analyze(fleet(series=False), START, START + 30, restored, cfg)


def test_window_must_not_be_empty_and_selectors_are_validated():
    analyzer = Analyzer(PromClient("http://127.0.0.1:1"), load_config(), CANARY, BASELINE)
    with pytest.raises(ValueError, match="empty"):
        analyzer.analyze(END, END)
    with pytest.raises(ConfigError, match="--canary"):
        Analyzer(PromClient("http://127.0.0.1:1"), load_config(), "canary", BASELINE)


def test_verdict_renders_table_and_json():
    v, _ = analyze(fleet(ttft_mult=1.2))
    text = v.table()
    assert text.startswith("Canary verdict: ROLLBACK") and "ttft" in text and "High!" in text
    doc = v.to_dict()
    assert doc["verdict"] == "ROLLBACK" and doc["exit_code"] == 1
    assert doc["metrics"][0]["name"] == "ttft" and len(doc["metrics"][0]["interval"]) == 2
    assert 0 <= doc["score"] <= 100


def test_decide_combination_rule():
    crit = np.array([True, True, False])
    codes = np.array([[PASS, PASS, HIGH], [HIGH, PASS, PASS], [PASS, NODATA, PASS], [LOW, PASS, INCONCLUSIVE],
                      [PASS, INCONCLUSIVE, PASS]])
    harm = codes == HIGH
    assert decide(codes, harm, crit).tolist() == [PROMOTE, ROLLBACK, HOLD, PROMOTE, HOLD]


def test_default_config_and_validation_errors():
    cfg = load_config()
    assert [m.name for m in cfg.metrics][:3] == ["ttft", "itl", "error_ratio"]
    critical = [m for m in cfg.metrics if m.critical]
    assert sum(cfg.metric_alpha(m) for m in critical) == pytest.approx(cfg.alpha)
    assert cfg.horizon_s == 600 and cfg.interval_s == 30
    base = {"alpha": 0.01, "metrics": [{"name": "a", "kind": "histogram", "metric": "x", "allowed_effect": 0.1,
                                        "critical": True}]}
    assert parse_config(base).metrics[0].min_samples == 100
    bad = [({"kind": "gauge"}, "kind"), ({"critical": False}, "critical"), ({"direction": "up"}, "direction"),
           ({"allowed_effect": -1}, "allowed_effect"), ({"metric": "bad name"}, "metric"),
           ({"kind": "series", "query": "avg(x)"}, "query"), ({"matchers": "job=vllm"}, "matchers")]
    for change, field in bad:
        doc = {**base, "metrics": [{**base["metrics"][0], **change}]}
        with pytest.raises(ConfigError, match=field):
            parse_config(doc)
    with pytest.raises(ConfigError, match="unique"):
        parse_config({**base, "metrics": base["metrics"] * 2})
    with pytest.raises(ConfigError, match="--metric"):
        cfg.select(["nope"])


def test_durations_and_selectors():
    assert parse_duration("30s") == 30 and parse_duration("5m") == 300 and parse_duration("1h30m") == 5400
    assert parse_duration("90") == 90 and parse_duration(2.5) == 2.5
    for bad in ("", "5ms", "-1m", "abc", 0):
        with pytest.raises(ConfigError):
            parse_duration(bad)
    assert parse_selector('{track="canary", node=~"gpu-0[12]"}', "--canary") == 'track="canary", node=~"gpu-0[12]"'
    for bad in ("track=canary", 'track="canary"}', "", 'track="a" or 1'):
        with pytest.raises(ConfigError):
            parse_selector(bad, "--canary")


def test_fake_answers_unknown_metric_with_empty_vector():
    status, body = FleetData()("query", {"query": ['sum(increase(nope_total{track="canary"}[5m]))']})
    assert (status, body) == ok(vector([]))


def test_final_look_hold_says_it_is_inconclusive_and_timing_override():
    cfg = load_config().with_timing(horizon_s=300, interval_s=30)
    v, _ = analyze(fleet(n_c=600, n_b=11_400, err_c=1), config=cfg)  # window 300 s = the whole horizon
    assert v.final and v.time_fraction == 1.0
    assert v.verdict == "HOLD" and row(v, "error_ratio").classification == "Inconclusive"  # 1 error in 600
    assert any("horizon is reached" in r for r in v.reasons)
    with pytest.raises(ConfigError):
        cfg.with_timing(horizon_s=0)
