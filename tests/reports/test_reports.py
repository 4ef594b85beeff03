"""``gpuobs report``: drill and rollout HTML reports against a fake Prometheus.

What is checked: the file exists; it is self-contained (no src/href but embedded PNGs and the
runbook links, no stylesheet or script from anywhere); it embeds one valid PNG per panel; the drill
timeline and verdict are in it; hostile strings from labels, hostnames and documents are escaped in
the HTML and quoted in the PromQL; queries are scoped to the drill's host and GPU over the right
window; errors give the documented exit codes without tracebacks.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import socket
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpuobs.cli.report import newest_result, register
from gpuobs.drills.catalogue import DRILLS, PANELS
from gpuobs.promapi.prometheus import PrometheusUnavailable
from gpuobs.reports.drill import BEFORE_S, write_drill_report
from gpuobs.reports.html import PNG_SIGNATURE
from gpuobs.reports.rollout import (
    DISTRIBUTIONS,
    OVER_TIME,
    bucket_counts,
    bucket_quantile,
    write_rollout_report,
)
from tests.fakes.prometheus import FakePrometheus, fleet, matrix, ok

HOSTILE_HOST = 'gpu-"n0"<script>alert(1)</script>'
RUNBOOK = "http://127.0.0.1:9097/runbooks/thermal.md#gputhrottling"
T0 = 1_700_000_000.0
DATA_PNG = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=]+)")


class DrillData:
    """Responder: every range query gets one series per GPU label value seen in the query (or one),
    ramping over the window, labelled with the hostile host; ``reject`` substrings answer 400."""

    def __init__(self, reject: tuple[str, ...] = ()):
        self.reject = reject

    def __call__(self, endpoint: str, params: dict[str, list[str]]):
        q = params["query"][0]
        if any(r in q for r in self.reject):
            return 400, {"status": "error", "errorType": "bad_data", "error": "parse error <b>here</b>"}
        start, end, step = (float(params[k][0]) for k in ("start", "end", "step"))
        pts, t, i = [], start, 0
        while t <= end:
            pts.append((t, 40.0 + i))
            t, i = t + step, i + 1
        return ok(matrix([({"node": HOSTILE_HOST, "Hostname": "localhost", "gpu": "1", "rank": "3", "xid": "48"}, pts)]))


def stack_doc(run, prometheus):
    """A minimal stack.json (gpuobs.stack.state shape) pointing at ``prometheus``."""
    return {"run_dir": str(run), "nodes": 1, "hostnames": ["gpu-node-00"], "token_file": str(run / "admin-token"),
            "components": {}, "urls": {"prometheus": prometheus, "alertmanager": prometheus, "pager": prometheus,
                                       "nodes": ["http://127.0.0.1:9/metrics"]}}


def drill_result(**over) -> dict:
    res = {"drill": "thermal", "hostname": HOSTILE_HOST, "profile": "drill",
           "faults": [{"kind": "thermal", "gpu": 1, "cooling_factor": 3.0, "id": "f1"}],
           "alerts": [{"alertname": "GPUThrottling", "expected_receiver": "ticket", "fired_s": 30.0,
                       "paged_s": 31.5, "receiver": "ticket", "resolved_s": 200.0, "runbook_url": RUNBOOK}],
           "injected_at": T0, "cleared_s": 120.0, "unexpected": [], "problems": [], "ok": True}
    res.update(over)
    return res


def pngs(text: str) -> list[bytes]:
    return [base64.b64decode(m) for m in DATA_PNG.findall(text)]


class Tags(HTMLParser):
    """Every start tag and its attributes, as a browser's parser would see them."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def assert_self_contained(text: str, allowed_links: set[str]) -> None:
    tags = Tags(text).tags
    for tag, attrs in tags:
        assert tag not in ("script", "link", "iframe", "object", "embed", "base", "form", "frame"), tag
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
        if "src" in attrs:
            assert attrs["src"].startswith("data:image/png;base64,"), attrs["src"][:80]
        if "href" in attrs:
            assert attrs["href"] in allowed_links, attrs["href"]
        assert "url(" not in attrs.get("style", "")
    style = "".join(re.findall(r"<style>(.*?)</style>", text, re.S))
    assert "url(" not in style and "@import" not in style
    assert ("meta", {"http-equiv": "Content-Security-Policy",
                     "content": "default-src 'none'; img-src data:; style-src 'unsafe-inline'"}) in tags
    assert "<script" not in text.lower()


def _dead_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def test_every_drill_has_panels():
    assert set(DRILLS) <= set(PANELS)


def test_drill_report_self_contained_scoped_and_escaped(tmp_path):
    with FakePrometheus(DrillData()) as fp:
        path = write_drill_report(drill_result(), fp.url, tmp_path / "out", now=T0 + 3600)
    assert path.exists() and path.name == f"drill-thermal-{int(T0)}.html"
    text = path.read_text()
    assert_self_contained(text, {RUNBOOK})
    images = pngs(text)
    assert len(images) == len(PANELS["thermal"]) == 4
    assert all(img.startswith(PNG_SIGNATURE) and len(img) > 1000 for img in images)
    # header: verdict, timeline values, per-hop latencies, runbook link, escaped host
    assert "PASS" in text and "FAIL" not in text
    for value in ("30.0 s", "31.5 s", "1.5 s", "120.0 s", "200.0 s", "80.0 s"):
        assert value in text, value
    assert f'href="{RUNBOOK}"' in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "GPUThrottling" in text
    # queries: the hostile host quoted as a PromQL string, GPU-scoped, over the drill's window
    queries = [r["params"] for r in fp.requests]
    assert len(queries) == 4
    for p in queries:
        q = p["query"][0]
        assert 'node="gpu-\\"n0\\"<script>alert(1)</script>"' in q, q
        assert float(p["start"][0]) == pytest.approx(T0 - BEFORE_S)
        assert float(p["end"][0]) == pytest.approx(T0 + 230.0)
    assert sum('gpu="1"' in p["query"][0] for p in queries) == 3
    assert any("DCGM_FI_DEV_THERMAL_VIOLATION" in p["query"][0] and "/ 1e9" in p["query"][0] for p in queries)


def test_drill_report_fail_false_alerts_and_rejected_query(tmp_path):
    res = drill_result(drill="xid", faults=[{"kind": "xid", "gpu": 0, "code": 48}], ok=False,
                       unexpected=["GpuXidWarning{node=<img src=x onerror=alert(1)>}"],
                       problems=["GpuXidCritical did not resolve after the fault was cleared"],
                       alerts=[{"alertname": "GpuXidCritical", "expected_receiver": "page", "fired_s": 12.0,
                                "paged_s": None, "receiver": None, "resolved_s": None,
                                "runbook_url": "javascript:alert(1)"}])
    with FakePrometheus(DrillData(reject=("DCGM_FI_DEV_XID_ERRORS{",))) as fp:
        path = write_drill_report(res, fp.url, tmp_path, now=T0 + 400)
        ends = {float(r["params"]["end"][0]) for r in fp.requests}
    text = path.read_text()
    assert_self_contained(text, set())
    assert "FAIL" in text and "did not resolve" in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "query rejected (bad_data): parse error &lt;b&gt;here&lt;/b&gt;" in text
    assert len(pngs(text)) == len(PANELS["xid"]) - 1  # the rejected query's panel is said, not plotted empty
    assert ends == {T0 + 400}  # unresolved: the window runs to now


class OnlySome(DrillData):
    """DrillData for queries naming one of ``present``; every other query has no series (a metric the
    stack's exporter profile does not export, or a path that did not run)."""

    def __init__(self, present: tuple[str, ...]):
        super().__init__()
        self.present = present

    def __call__(self, endpoint, params):
        if not any(m in params["query"][0] for m in self.present):
            return ok(matrix([]))
        return super().__call__(endpoint, params)


def _figure_captions(text: str) -> list[str]:
    return re.findall(r"<figcaption>(.*?)</figcaption>", text, re.S)


def test_xid_drill_report_plots_the_kernel_log_path_that_paged_first_and_no_empty_dcgm_panel(tmp_path):
    """Issue 29: on the default stack (logwatch on the nodes) GpuKernelXidCritical pages from logwatch's
    counter, and the exporter's DCGM_EXP_XID_ERRORS_COUNT panel was always empty."""
    res = drill_result(drill="xid", faults=[{"kind": "xid", "gpu": 1, "code": 48}],
                       alerts=[{"alertname": "GpuKernelXidCritical", "expected_receiver": "page", "fired_s": 2.0,
                                "paged_s": 4.0, "receiver": "page", "resolved_s": 70.0, "runbook_url": None}])
    with FakePrometheus(OnlySome(("gpuobs_xid_events_total", "DCGM_FI_DEV_XID_ERRORS{"))) as fp:
        text = write_drill_report(res, fp.url, tmp_path, now=T0 + 3600).read_text()
    caps = _figure_captions(text)
    assert len(pngs(text)) == len(caps) == 2
    assert "gpuobs_xid_events_total{" in caps[0], caps  # the path that paged comes first
    assert not any("DCGM_EXP_XID_ERRORS_COUNT" in c for c in caps)
    absent = text.split("Not on this profile", 1)[1]
    assert "DCGM_EXP_XID_ERRORS_COUNT" in absent and "not on this profile" in absent


def test_xid_drill_report_on_the_dcgm_path_puts_the_exporter_panel_first():
    from gpuobs.reports.drill import order_panels
    res = {"drill": "xid", "alerts": [{"alertname": "GpuXidCritical", "paged_s": 9.0}]}
    assert "DCGM_EXP_XID_ERRORS_COUNT" in order_panels(PANELS["xid"], res)[0].queries[0][1]
    res = {"drill": "xid", "alerts": [{"alertname": "GpuKernelXidCritical", "paged_s": 3.0}]}
    assert "gpuobs_xid_events_total" in order_panels(PANELS["xid"], res)[0].queries[0][1]


def test_thermal_report_says_the_throttle_ratio_is_not_on_this_profile(tmp_path):
    """The stock exporter profile has no DCGM_FI_DEV_THERMAL_VIOLATION: no empty plot, a line saying so;
    a ticket-severity alert reads "ticketed", not "paged"."""
    with FakePrometheus(OnlySome(("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "vllm:"))) as fp:
        text = write_drill_report(drill_result(), fp.url, tmp_path, now=T0 + 3600).read_text()
    caps = _figure_captions(text)
    assert len(pngs(text)) == len(caps) == 3 and not any("THERMAL_VIOLATION" in c for c in caps)
    assert "Fraction of time thermally throttled" in text.split("Not on this profile", 1)[1]
    assert "ticketed GPUThrottling -&gt; ticket" in text and "paged GPUThrottling" not in text


def test_drill_report_unreachable_prometheus_writes_nothing(tmp_path):
    with pytest.raises(PrometheusUnavailable):
        write_drill_report(drill_result(), _dead_url(), tmp_path / "out", now=T0 + 3600)
    assert not list(tmp_path.rglob("*.html"))


def rollout_doc(**over) -> dict:
    doc = {"rollout_id": "r-1<script>x</script>", "version": "1.6.1", "baseline_version": "1.6.0",
           "state": "RolledBack", "reason": "ttft regressed", "started_at": T0, "ended_at": T0 + 900,
           "stages": [{"index": 0, "share": "5%", "nodes": ["gpu-node-00"], "started_at": T0,
                       "ended_at": T0 + 300, "verdict": "PROMOTE"},
                      {"index": 1, "share": "25%", "hosts": ["gpu-node-01", "gpu-node-02"],
                       "started_at": T0 + 300, "ended_at": T0 + 900, "verdict": "ROLLBACK"}],
           "final_verdict": {"verdict": "ROLLBACK", "reasons": ["ttft: High (+21.0%) is harmful"],
                             "metrics": [{"name": "ttft", "classification": "High", "harmful": True,
                                          "effect": 0.21, "interval": [0.15, 0.27], "scale": "relative",
                                          "evidence": {"z": 5.2, "boundary": 3.1}, "critical": True,
                                          "baseline": {"p50": 0.12, "p99": 0.9}, "canary": {"p50": 0.15, "p99": 1.1}},
                                         {"name": "errors", "classification": "Pass", "effect": None}]},
           "canary_selector": 'track="canary"', "baseline_selector": '{track="baseline"}'}
    doc.update(over)
    return doc


def rollout_fleet():
    data = fleet(ttft_mult=1.2)
    for track, level in (("canary", 1.1), ("baseline", 0.9)):
        data.series[track]["time_to_first_token"] = [level] * 30
        data.series[track]["inter_token_latency"] = [level / 10] * 30
        data.series[track]["request_success_total"] = [0.01] * 30
    data.step_start = T0 - 60
    return data


def test_rollout_report(tmp_path):
    with FakePrometheus(rollout_fleet()) as fp:
        path = write_rollout_report(rollout_doc(prometheus=fp.url), tmp_path, now=T0 + 3600)
    assert path.name == "rollout-r-1_script_x_script_.html"
    text = path.read_text()
    assert_self_contained(text, set())
    images = pngs(text)
    assert len(images) == len(DISTRIBUTIONS) + len(OVER_TIME) == 10
    assert all(img.startswith(PNG_SIGNATURE) for img in images)
    for needle in ("RolledBack", "ROLLBACK", "PROMOTE", "+21.0%", "[+15.0%, +27.0%]", "z=5.2", "p99=0.9",
                   "gpu-node-01, gpu-node-02", "25%", "r-1&lt;script&gt;x&lt;/script&gt;",
                   '<td class="num">600</td>', '<td class="num">11400</td>'):
        assert needle in text, needle
    qs = [r["params"]["query"][0] for r in fp.requests]
    assert 'sum by (le) (increase(vllm:time_to_first_token_seconds_bucket{track="canary"}[900s]))' in qs
    assert any('track="baseline",finished_reason="error"' in q for q in qs)
    instant = [r for r in fp.requests if r["endpoint"] == "query"]
    assert {float(r["params"]["time"][0]) for r in instant} == {T0 + 900}


def test_rollout_report_has_p50_over_time_and_the_deciding_metric_first(tmp_path):
    """Issue 29: the p99-only panels were noisy and did not show the p50 shift a TTFT rollback rested on:
    TTFT p50 and p99 per track over a stated 3m window, the deciding metric's (ttft) panels first."""
    from gpuobs.reports.rollout import QUANTILE_WINDOW, deciding_metric
    with FakePrometheus(rollout_fleet()) as fp:
        text = write_rollout_report(rollout_doc(prometheus=fp.url), tmp_path, now=T0 + 3600).read_text()
        ranged = [r["params"]["query"][0] for r in fp.requests if r["endpoint"] == "query_range"]
    assert QUANTILE_WINDOW == "3m" and "3m windows" in text
    p50 = 'histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{track="canary"}[3m])))'
    assert p50 in ranged and p50.replace('"canary"', '"baseline"') in ranged
    assert ranged.index(p50) < ranged.index(p50.replace("0.5", "0.99"))  # p50 first, p99 kept
    caps = re.findall(r"<figcaption>(.*?)</figcaption>", text, re.S)
    assert "TTFT p50" in text and "The verdict rested on ttft" in text
    assert "time_to_first_token" in caps[0] and "time_to_first_token" in caps[1]  # deciding metric first
    assert text.index("Over time, canary vs baseline") < text.index("distributions over the rollout")
    itl_doc = rollout_doc(final_verdict={"verdict": "ROLLBACK", "metrics": [
        {"name": "ttft", "classification": "Pass", "critical": True},
        {"name": "itl", "classification": "High", "harmful": True, "critical": True}]})
    assert deciding_metric(itl_doc) == "itl" and deciding_metric({}) is None


def test_rollout_report_lists_failed_rules_and_warnings_with_messages(tmp_path):
    """Issue 29: the compatibility table said "failed rules: -" for a node with warnings and the warnings
    the CLI printed were missing."""
    def rule(rid, status, msg):
        return {"rule": rid, "status": status, "message": msg, "source": "engine_requirements.csv"}
    nodes = [{"hostname": "gpu-node-00", "gpus": 8, "gpu": "H100", "driver": "550.54", "verdict": "COMPATIBLE_WITH_WARNINGS",
              "failed": [], "warned": ["driver-branch-eol"],
              "rules": [rule("toolkit-min-driver", "pass", "ok"),
                        rule("driver-branch-eol", "warn", "driver branch R550 is past end of life")]},
             {"hostname": "gpu-node-01", "gpus": 8, "gpu": "H100", "driver": "535.1", "verdict": "INCOMPATIBLE",
              "failed": ["toolkit-min-driver"],  # no "warned" key: a document from before it existed
              "rules": [rule("toolkit-min-driver", "fail", "CUDA 12.8 needs driver >= 570.26"),
                        rule("fm-version", "warn", "fabric manager version not reported")]}]
    doc = rollout_doc(state="Rejected", stages=[], gates=[{"gate": "compat", "outcome": "rejected", "ts": T0,
                                                           "detail": {"verdict": "INCOMPATIBLE", "nodes": nodes}}])
    text = write_rollout_report(doc, tmp_path, now=T0 + 60).read_text()
    compat = text[text.index("Compatibility gate"):text.index("<h2>Stages</h2>")]
    assert "warn: driver-branch-eol" in compat and "fail: toolkit-min-driver; warn: fm-version" in compat
    assert "<td>-</td></tr>" not in compat.split("<table", 1)[1].split("</table>")[0]
    assert "fix: H100 / driver 535.1: toolkit-min-driver: CUDA 12.8 needs driver &gt;= 570.26" in compat
    assert "warning: H100 / driver 550.54: driver-branch-eol: driver branch R550 is past end of life" in compat
    assert "warning: H100 / driver 535.1: fm-version: fabric manager version not reported" in compat


def test_rollout_report_tolerates_a_minimal_document(tmp_path):
    path = write_rollout_report({"rollout_id": "r2", "stages": [{"verdict": "HOLD"}], "final_verdict": {}},
                                tmp_path, now=T0)
    text = path.read_text()
    assert "plots omitted" in text and "HOLD" in text and not pngs(text)


def test_rollout_report_unreachable(tmp_path):
    doc = rollout_doc(prometheus=_dead_url())
    with pytest.raises(PrometheusUnavailable):
        write_rollout_report(doc, tmp_path / "strict", strict=True, now=T0 + 3600)
    path = write_rollout_report(doc, tmp_path, now=T0 + 3600)
    assert "Prometheus could not answer" in path.read_text()


def test_bucket_helpers():
    bounds, counts = bucket_counts([("+Inf", 10.0), ("0.5", 4.0), ("1.0", 9.0), ("0.1", 0.0)])
    assert bounds == [0.1, 0.5, 1.0] and counts == [0.0, 4.0, 5.0, 1.0]
    assert bucket_quantile(0.5, bounds, counts) == pytest.approx(0.5 + 0.5 * (5 - 4) / 5)
    assert bucket_quantile(0.99, bounds, counts) == 1.0  # in +Inf: the last finite bound, like Prometheus
    assert bucket_quantile(0.5, bounds, [0, 0, 0, 0]) != bucket_quantile(0.5, bounds, [0, 0, 0, 0])  # NaN


# ---- CLI -----------------------------------------------------------------------------------------------
def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuobs")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def save(run: Path, name: str, epoch: int, res: dict) -> Path:
    (run / "drills").mkdir(parents=True, exist_ok=True)
    path = run / "drills" / f"{name}-{epoch}.json"
    path.write_text(json.dumps(res))
    return path


def test_cli_drill_report(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(["report", "drill", "thermal", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "no saved result for drill 'thermal'" in err and "Traceback" not in err
    save(run, "thermal", int(T0) - 999, drill_result(injected_at=T0 - 999))
    save(run, "thermal", int(T0), drill_result())
    save(run, "thermal-old", int(T0) + 5, drill_result())  # another name's prefix: ignored
    assert newest_result(run, "thermal").name == f"thermal-{int(T0)}.json"
    assert cli(["report", "drill", "thermal", "--run-dir", str(run)]) == 2  # no stack.json, no --prometheus
    assert "--prometheus" in capsys.readouterr().err
    (run / "stack.json").write_text(json.dumps(stack_doc(run, _dead_url())))
    assert cli(["report", "drill", "thermal", "--run-dir", str(run)]) == 1
    err = capsys.readouterr().err
    assert "cannot reach Prometheus" in err and "Traceback" not in err
    with FakePrometheus(DrillData()) as fp:
        (run / "stack.json").write_text(json.dumps(stack_doc(run, fp.url)))
        assert cli(["report", "drill", "thermal", "--run-dir", str(run)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert Path(last) == run / "reports" / f"drill-thermal-{int(T0)}.html" and Path(last).exists()
    older = run / "drills" / f"thermal-{int(T0) - 999}.json"
    with FakePrometheus(DrillData()) as fp:
        assert cli(["report", "drill", "thermal", "--result", str(older), "--prometheus", fp.url,
                    "--run-dir", str(run), "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out.strip().endswith(f"drill-thermal-{int(T0) - 999}.html")


def test_cli_rollout_report(tmp_path, capsys):
    assert cli(["report", "rollout", "--file", str(tmp_path / "missing.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert cli(["report", "rollout", "--file", str(bad)]) == 2
    doc = tmp_path / "rollout.json"
    doc.write_text(json.dumps(rollout_doc(prometheus=_dead_url())))
    assert cli(["report", "rollout", "--file", str(doc), "--out", str(tmp_path / "o")]) == 1
    with FakePrometheus(rollout_fleet()) as fp:
        assert cli(["report", "rollout", "--file", str(doc), "--prometheus", fp.url, "--out", str(tmp_path / "o")]) == 0
    last = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert last.parent == tmp_path / "o" and last.exists() and len(pngs(last.read_text())) == len(DISTRIBUTIONS) + len(OVER_TIME)


def test_drill_report_says_what_the_incident_cost(tmp_path):
    res = drill_result(drill="xid", impact={"incident": 7, "line": "5 min: serving m on n: 3 requests failed",
                                            "queries": {"failed": 'sum(increase(x{a="<b>"}[300s]))'}})
    with FakePrometheus(OnlySome(("gpuobs_xid_events_total",))) as fp:
        text = write_drill_report(res, fp.url, tmp_path, now=T0 + 3600).read_text()
    cost = text.split("What it cost", 1)[1].split("Timeline", 1)[0]
    assert "Incident #7: 5 min: serving m on n: 3 requests failed" in cost and "&lt;b&gt;" in cost
    with FakePrometheus(OnlySome(("gpuobs_xid_events_total",))) as fp:
        text = write_drill_report(drill_result(drill="xid"), fp.url, tmp_path / "b", now=T0 + 3600).read_text()
    assert "Not measured: no incident found" in text
