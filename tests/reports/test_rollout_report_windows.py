"""The rollout report shows its own rollout's data only, labelled as the CLI labels it, on readable axes.

Rollouts run on the controller's fakes (simulated clock); the report reads a fake Prometheus that
answers like the real one would for two rollouts back to back: the previous rollout's canary carries
the same ``track="canary"`` labels, so any query window reaching before rollout B started picks up
rollout A's 2 s TTFT. The report for B must show none of it.
"""

from __future__ import annotations

import json
import re

import pytest

from gpuobs.rollout.report import report
from gpuobs.reports import plots
from gpuobs.reports import rollout as rr
from tests.fakes.prometheus import FakePrometheus, matrix, ok, vector
from tests.fakes.rollout import FakeFleet, rig, spec

A_TTFT, B_TTFT, BASE_TTFT = 2.0, 0.3, 0.25
BOUNDS = ("0.1", "0.5", "1.0", "2.5", "5.0", "+Inf")


class TwoRollouts:
    """Prometheus for "rollout A's canary until ``b_start``, then rollout B's".

    Range queries: every point at t evaluates a window ``[t - w, t]`` (w from the query's ``[1m]``);
    a canary window reaching before ``b_start`` sees A's level. Instant ``increase(...[Ns])`` at
    ``time``: canary buckets hold A's requests (in the 2.5 s bucket) when ``time - N < b_start``."""

    def __init__(self, b_start: float):
        self.b_start = b_start

    @staticmethod
    def _window(q: str) -> float:
        m = re.search(r"\[(\d+)([sm])\]", q)
        assert m, q
        return float(m.group(1)) * (60.0 if m.group(2) == "m" else 1.0)

    def __call__(self, endpoint, params):
        q = params["query"][0]
        w, canary = self._window(q), 'track="canary"' in q
        if endpoint == "query_range":
            start, end, step = (float(params[k][0]) for k in ("start", "end", "step"))
            pts, t = [], start
            while t <= end + 1e-9:
                level = (A_TTFT if t - w < self.b_start else B_TTFT) if canary else BASE_TTFT
                pts.append((t, level if "time_to_first_token" in q else 1.0))
                t += step
            return ok(matrix([({}, pts)]))
        at = float(params["time"][0])
        a_mixed = canary and at - w < self.b_start
        counts = {"0.1": 0, "0.5": 90, "1.0": 100, "2.5": 100 + (500 if a_mixed else 0)}
        counts.update({"5.0": counts["2.5"], "+Inf": counts["2.5"]})
        return ok(vector([({"le": le}, float(counts[le])) for le in BOUNDS], at=at))


def two_rollouts(tmp_path):
    """Rollout A (1.6.0, rolled back at stage 2) then, right after, rollout B (1.5.0, succeeded)."""
    r = rig(tmp_path, {1: ["PROMOTE"], 2: ["ROLLBACK"]})
    a = r.controller.run(r.controller.create(spec(version="1.6.0")).id)
    r.analyzers.script = {1: ["PROMOTE"], 2: ["PROMOTE"]}
    r.clock.sleep(1.0)  # B starts one second after A ended
    b = r.controller.run(r.controller.create(spec(version="1.5.0", interval_s=30.0, settle_s=10.0)).id)
    assert (a.state, b.state) == ("RolledBack", "Succeeded")
    docs = {x.id: json.loads(report(r.store, x.id, as_json=True)) for x in (a, b)}
    return r, docs[a.id], docs[b.id]


def test_report_for_rollout_b_has_no_sample_from_before_b_started(tmp_path, monkeypatch):
    r, doc_a, doc_b = two_rollouts(tmp_path)
    b_start, b_end = doc_b["started_at"], doc_b["ended_at"]
    assert doc_a["ended_at"] < b_start and b_end > b_start + rr.RATE_WINDOW_S
    drawn, dists = [], []
    real_ts, real_dist = rr.timeseries_png, rr.distribution_png
    monkeypatch.setattr(rr, "timeseries_png", lambda *a, **k: drawn.append((a, k)) or real_ts(*a, **k))
    monkeypatch.setattr(rr, "distribution_png", lambda *a, **k: dists.append(a) or real_dist(*a, **k))
    with FakePrometheus(TwoRollouts(b_start)) as fp:
        path = rr.write_rollout_report({**doc_b, "prometheus": fp.url}, tmp_path / "reports", now=b_end + 3600)
    text = path.read_text()
    # every query stays inside B: range queries start a rate window after B started, end when it ended
    for req in fp.requests:
        p, w = req["params"], TwoRollouts._window(req["params"]["query"][0])
        if req["endpoint"] == "query_range":
            assert float(p["start"][0]) - w >= b_start and float(p["end"][0]) <= b_end
        else:
            assert float(p["time"][0]) == b_end and b_end - w >= b_start
    # what was plotted: nothing before B's start, none of A's canary level
    assert len(drawn) == len(rr.OVER_TIME)
    for args, kwargs in drawn:
        assert kwargs["utc_origin"] == b_start
        for line in args[2]:
            assert min(line.xs) >= rr.RATE_WINDOW_S and A_TTFT not in line.ys, line
            assert "1.6.0" not in line.label
    labels = {line.label for args, _ in drawn for line in args[2]}
    assert labels == {"canary 1.5.0", "baseline 1.4.0"}
    canary = [g for a in dists for g in a[3] if g[0].startswith("canary")]
    assert canary and all(counts[3] == 0 for _, counts in canary)  # A's 2.5 s bucket is empty
    assert "1.6.0" not in text
    # the same data with the old 60 s look-back would have shown A (the fake is not blind to it)
    status, body = TwoRollouts(b_start)("query_range", {"query": [rr.OVER_TIME[0][2].format(
        sel='track="canary"', w="1m")], "start": [str(b_start - 60)], "end": [str(b_start)], "step": ["15"]})
    assert any(float(v) == A_TTFT for _, v in body["data"]["result"][0]["values"])


def test_times_and_stage_numbers_come_from_the_rollout_itself(tmp_path):
    r, doc_a, _ = two_rollouts(tmp_path)
    assert doc_a["stage_count"] == 3 and len(doc_a["stages"]) == 2
    start, end = rr.rollout_window(doc_a, now=doc_a["ended_at"] + 9999)
    assert (start, end) == (doc_a["started_at"], doc_a["ended_at"])  # no padding either side
    text = rr.write_rollout_report(doc_a, tmp_path / "reports", now=end + 9999).read_text()
    cells = re.findall(r"<tr><td>(\d+/\d+)</td>", text)
    assert cells[:2] == ["1/3", "2/3"]  # as the CLI prints "stage 1/3"; never "1/2"
    assert "stage 2/3 67% ROLLBACK" == rr.stage_label(doc_a["stages"][1], 1, rr.stage_count(doc_a))
    assert f"<th>ended</th><td>{rr.h.utc(end)}</td>" in text
    assert "1.6.0 against 1.4.0" in text
    # the timeline table lists every transition with its UTC time
    for t in doc_a["transitions"]:
        assert rr.h.utc(t["ts"]) in text and t["to_state"] in text


def test_short_rollout_is_not_padded(tmp_path):
    doc = {"rollout_id": "short", "version": "1.5.0", "state": "Aborted", "started_at": 1000.0, "ended_at": 1020.0,
           "stages": [{"index": 0, "share": "33%", "started_at": 1001.0, "ended_at": 1019.0}],
           "spec": {"stages": [1, 2, 3]}}
    assert rr.rollout_window(doc, now=5000.0) == (1000.0, 1020.0)
    assert rr.over_time_range(1000.0, 1020.0, 5000.0) is None  # shorter than one rate window
    text = rr.write_rollout_report(doc, tmp_path, now=5000.0).read_text()
    assert "<th>duration</th><td>20 s</td>" in text and rr.h.utc(1020.0) in text
    running = {**doc, "state": "Canary", "ended_at": None}
    assert rr.rollout_window(running, now=1500.0) == (1000.0, 1500.0)


def test_rejected_report_has_the_compat_table_and_the_fleet_version(tmp_path):
    r = rig(tmp_path, {1: ["PROMOTE"]}, fleet=FakeFleet(versions=dict.fromkeys(("gpu-node-00", "gpu-node-01",
                                                                                     "gpu-node-02"), "1.4.0")))
    rec = r.controller.run(r.controller.create(spec(version="2.0.0", engine="vllm==0.26.0", cuda="13.0")).id)
    assert rec.state == "Rejected"
    doc = json.loads(report(r.store, rec.id, as_json=True))
    assert doc["baseline_version"] == "1.4.0" and doc["versions_before"]["gpu-node-01"] == "1.4.0"
    text = rr.write_rollout_report(doc, tmp_path / "reports", now=doc["ended_at"] + 60).read_text()
    assert "2.0.0 against 1.4.0" in text and "against ?" not in text
    compat = text.index("Compatibility gate")
    assert compat < text.index("<h2>Stages</h2>")  # on a Rejected report it comes right after the summary
    for host in ("gpu-node-00", "gpu-node-01", "gpu-node-02"):
        assert host in text[compat:]
    assert "INCOMPATIBLE" in text[compat:] and "toolkit-min-driver" in text[compat:]
    assert "fix: " in text[compat:]  # the failing rule's message says what to change
    assert "No stage ran" in text


def test_y_axes_counts_from_zero_and_a_minimum_relative_span():
    assert plots.y_limits([0.96, 1.0, 1.04], zero_based=True)[0] == 0.0
    lo, hi = plots.y_limits([0.0494, 0.0497], zero_based=False)
    assert hi - lo >= plots.MIN_REL_SPAN * 0.0497  # a 0.5% gap is 1/20 of the axis, not all of it
    assert (0.0497 - 0.0494) / (hi - lo) < 0.07
    lo, hi = plots.y_limits([100.0, 300.0], zero_based=False)
    assert lo < 100 < 300 < hi and hi - lo < 250  # a real change keeps its own scale
    assert plots.y_limits([0.0, 0.0], zero_based=True) == (0.0, 1.05)
    assert plots.y_limits([float("nan")], zero_based=True) is None
    assert plots.zero_based_unit("Xids") and plots.zero_based_unit("ratio") and not plots.zero_based_unit("s")


def test_series_and_markers_are_told_apart():
    marker_colours = {c for c, _ in plots.MARKER_STYLE.values()}
    assert not marker_colours & set(plots.DATA_COLORS)
    a, b = plots.data_style(0, 2), plots.data_style(1, 2)
    # identical canary and baseline lines: different colour, style and width, so both stay visible
    assert a["color"] != b["color"] and a["linestyle"] != b["linestyle"] and a["linewidth"] > b["linewidth"]
    assert plots.unique_labels(["GPU 0", "GPU 0", "GPU 1", "GPU 0"]) == ["GPU 0", "GPU 0 #2", "GPU 1", "GPU 0 #3"]
    png = plots.timeseries_png("same", "s", [plots.Line("x", [0, 1], [1.0, 1.0]), plots.Line("x", [0, 1], [1.0, 1.0])],
                               [plots.Marker(0.5, "stage start")], utc_origin=1_700_000_000.0)
    assert png.startswith(b"\x89PNG")


@pytest.mark.parametrize("doc, expected", [
    ({"baseline_version": "1.4.0"}, "1.4.0"),
    ({"version": "2.0.0", "versions_before": {"a": "1.4.0", "b": "1.4.0", "c": "1.3.0"}}, "1.4.0"),
    ({"version": "2.0.0", "spec": {"versions_before": {"a": "2.0.0", "b": "1.4.0"}}}, "1.4.0"),
    ({"version": "2.0.0"}, None),
])
def test_baseline_version(doc, expected):
    assert rr.baseline_version(doc) == expected


def test_a_driver_upgrade_report_plots_its_nodes_own_history_before_the_upgrade(tmp_path, monkeypatch):
    """A driver upgrade selects nodes by identity (the same series before and after), and judges each
    against its own history: its over-time panels start UPGRADE_LEAD_S before it."""
    r, _, doc_b = two_rollouts(tmp_path)
    doc = {**doc_b, "report_model": "NVIDIA L40S", "canary_selector": 'node=~"gpu-node-19"',
           "baseline_selector": 'node=~"gpu-node-01|gpu-node-02"'}
    drawn = []
    real_ts = rr.timeseries_png
    monkeypatch.setattr(rr, "timeseries_png", lambda *a, **k: drawn.append((a, k)) or real_ts(*a, **k))
    with FakePrometheus(TwoRollouts(doc["started_at"])) as fp:
        path = rr.write_rollout_report({**doc, "prometheus": fp.url}, tmp_path / "reports", now=doc["ended_at"] + 60)
    starts = [float(q["params"]["start"][0]) - TwoRollouts._window(q["params"]["query"][0])
              for q in fp.requests if q["endpoint"] == "query_range"]
    assert starts and min(starts) == pytest.approx(doc["started_at"] - rr.UPGRADE_LEAD_S)
    assert all(k["utc_origin"] == doc["started_at"] - rr.UPGRADE_LEAD_S for _, k in drawn)
    text = path.read_text()
    assert "GPU model plotted" in text and "10 min before the upgrade" in text
