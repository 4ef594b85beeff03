"""Attacks on the impact measurement and the pager's new routes: hostile input, bad samples and a
failing or hanging Prometheus (each test failed before its fix, or pins behaviour that held)."""

from __future__ import annotations

import math
import threading
import time

import pytest
import requests

from gpuobs.pager import impact
from gpuobs.pager.server import PagerServer
from gpuobs.pager.store import PageStore
from gpuobs.promapi.prometheus import PrometheusUnavailable, Series
from tests.pager.test_impact import CFG, ENGINE, T0, StubProm, counter, incident
from tests.pager.test_incidents import _payload

GPU = [{"node": "gpu-node-00", "gpu": "0"}]


def _spoil(s: Series, tail: tuple[float, ...]) -> Series:
    return Series(s.labels, s.timestamps, s.values[:-len(tail)] + tail)


def test_non_finite_samples_are_skipped_not_a_crash():
    ok = counter({**ENGINE, "finished_reason": "stop"}, lambda t: 1.0, T0 - 1000, T0 + 300)
    bad = _spoil(ok, (math.inf, math.nan, -math.inf))
    rank = _spoil(counter({"node": "gpu-node-00", "training_job": "j", "rank": "0"}, lambda t: 1.0, T0 - 1000, T0 + 300),
                  (math.inf, math.nan, -math.inf))
    p = StubProm({"vllm:request_success_total": [bad], "training_steps_total": [rank]}, GPU, 8)
    doc = impact.measure(p, CFG, incident(T0, T0 + 300), T0 + 400)
    clean = impact.measure(StubProm({"vllm:request_success_total": [ok]}, GPU, 8), CFG, incident(T0, T0 + 300), T0 + 400)
    assert doc["serving"][0]["requests"] == clean["serving"][0]["requests"] - 15  # 3 samples (15 s) dropped
    assert all(math.isfinite(v) for v in (doc["totals"]["gpu_hours_lost"], doc["training"][0]["stalled_s"]))
    assert impact.increase(Series({}, (0.0, 1.0, 2.0), (1.0, math.inf, 3.0)), 0.0, 2.0) == (2.0, 2.0)


@pytest.mark.parametrize("total", [math.nan, math.inf])
def test_a_non_finite_fleet_count_is_no_count(total):
    p = StubProm({}, GPU, 8)
    p.total = total
    doc = impact.measure(p, CFG, incident(T0, T0 + 300), T0 + 400)
    assert doc["fleet"]["gpus_total"] == 0 and doc["fleet"]["capacity_out_ratio"] == 0.0


def test_a_newline_in_a_node_name_stays_inside_the_promql_string():
    p = StubProm({}, [], 8)
    impact.measure(p, CFG, incident(T0, None, nodes=['a"} or vector(1) #', "b\nc"]), T0 + 400)
    for q, _ in p.asked[1:]:
        assert "\n" not in q and '\\"\\\\} or vector\\\\(1\\\\) #' in q


def test_an_unexpected_failure_keeps_the_last_numbers_with_a_one_line_error():
    class Store:
        def __init__(self):
            self.doc = {"measured_at": T0, "line": "ok"}

        def incident(self, iid):
            return {**incident(T0, None), "impact": self.doc}

        def record_impact(self, iid, doc):
            self.doc = doc

    def fn(inc, now):
        raise ValueError("cannot convert float NaN to integer\nTraceback ...")

    s = Store()
    doc = impact.ImpactWatcher(s, fn).measure_one(1, T0 + 60)
    assert doc["line"] == "ok" and doc["error_at"] == T0 + 60 and "\n" not in doc["error"]
    assert "NaN" not in doc["error"]  # no raw library text: the log has it


def test_a_failure_does_not_restore_older_numbers_over_newer_ones():
    class Store:
        def __init__(self):
            self.doc = {"measured_at": T0, "line": "old"}

        def incident(self, iid):
            return {**incident(T0, None), "impact": self.doc}

        def record_impact(self, iid, doc):
            self.doc = doc

    s = Store()

    def fn(inc, now):  # the watcher stores newer numbers while this measurement hangs and then fails
        s.doc = {"measured_at": T0 + 30, "line": "new"}
        raise PrometheusUnavailable("http://127.0.0.1:1", 2, "timed out")

    assert impact.ImpactWatcher(s, fn).measure_one(1, T0 + 60)["line"] == "new"


# ---- the pager's routes -----------------------------------------------------------------------------------
@pytest.fixture
def pager(tmp_path):
    store = PageStore(tmp_path / "pager.sqlite")
    box = {"fn": lambda inc, now: {"measured_at": now, "line": "fine", "window": {"start": now - 60, "end": now,
                                                                                  "seconds": 60}}}
    watcher = impact.ImpactWatcher(store, lambda inc, now: box["fn"](inc, now))
    srv = PagerServer(("127.0.0.1", 0), store, None, impact=watcher)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    store.deliver("page", _payload())
    yield f"http://127.0.0.1:{srv.server_address[1]}", store, box
    srv.shutdown()
    srv.server_close()
    store.close()


def test_impact_post_from_another_site_is_refused(pager):
    url, store, _ = pager
    (iid,) = [i["id"] for i in store.incidents()]
    r = requests.post(f"{url}/api/incidents/{iid}/impact", headers={"Origin": "http://evil.example"}, timeout=5)
    assert r.status_code == 403 and store.incident(iid)["impact"] is None


def test_impact_post_bad_ids_and_bodies(pager):
    url, store, _ = pager
    (iid,) = [i["id"] for i in store.incidents()]
    assert requests.post(f"{url}/api/incidents/999999999999/impact", timeout=5).json()["field"] == "id"
    for bad in ("abc", "-1", "1e3", "%00", "1/2"):
        r = requests.post(f"{url}/api/incidents/{bad}/impact", timeout=5)
        assert r.status_code == 404 and "Traceback" not in r.text
    r = requests.post(f"{url}/api/incidents/{iid}/impact", data=b"x" * 100_000, timeout=5)
    assert r.status_code == 200 and r.json()["impact"]["line"] == "fine"


def test_a_hanging_prometheus_does_not_block_the_console(pager):
    url, store, box = pager
    (iid,) = [i["id"] for i in store.incidents()]
    assert requests.post(f"{url}/api/incidents/{iid}/impact", timeout=5).status_code == 200  # good numbers first
    gate, got = threading.Event(), []

    def hang(inc, now):
        gate.wait(10)
        raise PrometheusUnavailable("http://127.0.0.1:1", 2, "timed out")
    box["fn"] = hang
    th = threading.Thread(target=lambda: got.append(requests.post(f"{url}/api/incidents/{iid}/impact", timeout=20)))
    th.start()
    try:
        t0 = time.monotonic()
        assert requests.get(f"{url}/", timeout=5).status_code == 200
        assert requests.get(f"{url}/api/incidents/{iid}", timeout=5).status_code == 200
        assert time.monotonic() - t0 < 3
    finally:
        gate.set()
        th.join()
    # the outage answers 502 (not the old numbers as if new) and keeps the last good numbers
    assert got[0].status_code == 502 and got[0].json()["impact"]["line"] == "fine"
    assert "timed out" in store.incident(iid)["impact"]["error"] and store.incident(iid)["impact"]["line"] == "fine"


def test_impact_post_on_a_measurement_crash_answers_one_line_and_keeps_numbers(pager):
    url, store, box = pager
    (iid,) = [i["id"] for i in store.incidents()]
    assert requests.post(f"{url}/api/incidents/{iid}/impact", timeout=5).status_code == 200

    def crash(inc, now):
        raise ValueError("cannot convert float NaN to integer")
    box["fn"] = crash
    r = requests.post(f"{url}/api/incidents/{iid}/impact", timeout=5)
    assert r.status_code == 502 and r.json()["impact"]["line"] == "fine" and "NaN" not in r.text


@pytest.mark.parametrize("qs", ["state=%3Cscript%3E", "severity=" + "x" * 5000, "channel=p%C3%BCge", "state=OPEN"])
def test_bad_console_filters_name_the_field_and_the_allowed_values(pager, qs):
    url, _, _ = pager
    r = requests.get(f"{url}/?{qs}", timeout=5)
    field = qs.split("=")[0]
    assert r.status_code == 400 and f"{field} must be one of" in r.text and "<script>" not in r.text
    assert "x" * 300 not in r.text


def test_hostile_node_filter_and_labels_are_escaped(pager):
    url, store, _ = pager
    hostile = _payload()
    hostile["groupKey"] = "other"
    for a in hostile["alerts"]:
        a["fingerprint"] = "f2"
        a["labels"]["Hostname"] = '<img src=x onerror=alert(1)>"'
        a["labels"]["node"] = '<img src=x onerror=alert(1)>"'
    store.deliver("page", hostile)
    r = requests.get(f"{url}/", params={"node": '<script>alert(1)</script>' + "ü" * 1000}, timeout=5)
    assert r.status_code == 200 and "<script>alert" not in r.text and "<img" not in r.text
    r = requests.get(f"{url}/", params={"node": '<img src=x onerror=alert(1)>"'}, timeout=5)
    assert r.status_code == 200 and "<img" not in r.text and "&lt;img" in r.text
    assert "script-src 'self'" in r.headers["Content-Security-Policy"]


def test_ack_with_hostile_by_and_note(pager):
    url, store, _ = pager
    (iid,) = [i["id"] for i in store.incidents()]
    r = requests.post(f"{url}/api/incidents/{iid}/ack", timeout=5,
                      json={"by": {"<b>": ["x"]}, "note": "<script>alert(1)</script>" + "n" * 2_000_000})
    assert r.status_code == 200 and r.json()["changed"]
    ev = [e for e in store.incident(iid)["timeline"] if e["kind"] == "acknowledged"][0]
    assert len(ev["note"]) == 500 and len(ev["by"]) <= 100
    page = requests.get(f"{url}/incidents/{iid}", timeout=5).text
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    r = requests.post(f"{url}/api/incidents/{iid}/ack", data="[1, 2", headers={"Content-Type": "application/json"},
                      timeout=5)
    assert r.status_code == 400 and "Traceback" not in r.text


def test_postmortem_html_never_carries_raw_tags_from_labels_or_the_impact(tmp_path):
    from gpuobs.pager import postmortem
    from tests.pager.test_postmortem import _incident

    inc = _incident(tmp_path)
    inc["impact"] = {"line": "training <img src=x onerror=alert(1)>: 1/8 ranks stalled", "measured_at": inc["opened_at"],
                     "window": {"start": inc["opened_at"], "end": inc["opened_at"] + 60, "seconds": 60},
                     "baseline_s": 900, "join": "node", "fleet": {}, "queries": {"q": 'x{node="<script>"}'},
                     "training": [{"training_job": "<script>alert(1)</script>", "gpus": 8, "ranks_stalled": 1,
                                   "stalled_s": 60, "gpu_hours_lost": 0.1}], "error": "<b>x</b>"}
    _, html_path, _ = postmortem.write(inc, tmp_path / "pm", None, now=inc["opened_at"] + 3600)
    page = html_path.read_text()
    assert "<script" not in page and "<img" not in page and "<b>x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and '<code>x{node="&lt;script&gt;"}</code>' in page


def test_an_outage_is_retried_every_interval_not_every_tick_and_a_failed_final_measurement_is_retried(tmp_path):
    store = PageStore(tmp_path / "p.sqlite")
    store.deliver("page", _payload())
    (iid,) = [i["id"] for i in store.incidents()]
    t = store.incident(iid)["opened_at"] - 200  # (times before the resolution below)
    store.record_impact(iid, {"measured_at": t, "line": "ok"})
    store.record_impact(iid, {"measured_at": t, "line": "ok", "error": "down", "error_at": t + 31})
    assert store.impact_due(t + 35, 30, t - 86400) == []  # tried at t+31: next at t+61, not every 5 s tick
    assert store.impact_due(t + 62, 30, t - 86400) == [iid]
    time.sleep(0.05)
    store.deliver("page", _payload("resolved"))
    r = store.incident(iid)["resolved_at"]
    assert store.impact_due(r + 1, 30, t - 86400) == [iid]  # the final measurement, at once
    store.record_impact(iid, {"measured_at": t, "line": "ok", "error": "down", "error_at": r + 1})
    assert store.impact_due(r + 5, 30, t - 86400) == []
    assert store.impact_due(r + 32, 30, t - 86400) == [iid]  # the final one failed: tried again
    store.close()


def test_a_resolved_incident_never_measured_is_retried_after_its_first_attempt_fails(tmp_path):
    store = PageStore(tmp_path / "p.sqlite")
    store.deliver("page", _payload())
    time.sleep(0.05)
    store.deliver("page", _payload("resolved"))
    (iid,) = [i["id"] for i in store.incidents()]
    r = store.incident(iid)["resolved_at"]
    w = impact.ImpactWatcher(store, lambda inc, now: (_ for _ in ()).throw(
        PrometheusUnavailable("http://127.0.0.1:1", 2, "down")))
    assert w.check(r + 1) == [iid] and store.incident(iid)["impact"]["error"]
    assert store.impact_due(r + 40, 30, r - 86400) == [iid]  # not given up: an outage must not lose the numbers
    store.close()


def test_pager_client_errors_name_the_pager_in_one_line_without_library_text():
    import http.server

    from gpuobs.promapi.alertmanager import AlertApiError, PagerClient

    for call in (lambda c: c.incidents(), lambda c: c.measure_impact(1, timeout_s=3)):
        with pytest.raises(AlertApiError) as ei:
            call(PagerClient("http://127.0.0.1:1"))
        msg = str(ei.value)
        assert msg.startswith("cannot reach the pager at http://127.0.0.1:1") and "Prometheus" not in msg
        assert "HTTPConnectionPool" not in msg and "\n" not in msg

    class Proxy(http.server.BaseHTTPRequestHandler):  # a proxy's HTML error page in front of the pager
        def do_POST(self):
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>Bad Gateway</html>")

        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(AlertApiError) as ei:
            PagerClient(f"http://127.0.0.1:{srv.server_address[1]}").measure_impact(1)
        assert "HTTP 502" in str(ei.value) and "Expecting value" not in str(ei.value)
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_annotation_naming_many_nodes_is_read_in_linear_time():
    names = [f"gpu-node-{i:06d}" for i in range(100_000)]
    inc = {"nodes": [], "alerts": [{"annotations": {"affected_nodes": ",".join(names + names[:10] + [" ", ""])}}]}
    t0 = time.monotonic()
    nodes, _ = impact.affected(inc)
    assert nodes == names and time.monotonic() - t0 < 2  # quadratic: minutes
