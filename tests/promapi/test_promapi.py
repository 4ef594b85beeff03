"""Prometheus HTTP API client against an in-process fake server: parsing, errors, retries, auth."""

from __future__ import annotations

import base64
import math
import socket

import pytest

from gpuobs.promapi.prometheus import (
    AT_TIME_PARAMS,
    PromClient,
    PrometheusQueryError,
    PrometheusResponseError,
    PrometheusUnavailable,
    parse_value,
)
from tests.fakes.prometheus import FakePrometheus, matrix, ok, vector


def client(url: str, **kw) -> tuple[PromClient, list[float]]:
    """A client whose backoff sleeps are recorded instead of slept."""
    slept: list[float] = []
    return PromClient(url, sleep=slept.append, **kw), slept


def test_query_parses_vector_with_nan_and_inf_and_sends_time():
    data = vector([({"le": "0.1"}, 3.0), ({"le": "+Inf"}, math.inf), ({"le": "x"}, math.nan)], at=1717243200.5)
    with FakePrometheus(lambda ep, p: ok(data, warnings=["partial response"])) as fp:
        c, _ = client(fp.url)
        res = c.query('sum by (le) (rate(x_bucket{track="canary"}[5m]))', at=1717243200.5)
    assert res.result_type == "vector"
    assert [s.labels["le"] for s in res.samples] == ["0.1", "+Inf", "x"]
    assert res.samples[0].value == 3.0 and res.samples[1].value == math.inf and math.isnan(res.samples[2].value)
    assert res.samples[0].timestamp == 1717243200.5
    assert res.has_nan and not res.empty
    assert res.warnings == ("partial response",)
    req = fp.requests[0]
    assert req["method"] == "POST" and req["endpoint"] == "query"
    assert req["params"]["query"] == ['sum by (le) (rate(x_bucket{track="canary"}[5m]))']
    assert req["params"]["time"] == ["1717243200.500"]
    assert req["params"]["timeout"] == ["10s"]


def test_query_sends_extra_params_which_cannot_replace_its_own():
    """AT_TIME_PARAMS (nocache=1: VictoriaMetrics answers at the time asked, not one latency offset
    earlier) travel with the query, by POST and by GET; query, time and timeout stay the caller's."""
    assert AT_TIME_PARAMS == {"nocache": "1"}
    for method in ("POST", "GET"):
        with FakePrometheus(lambda ep, p: ok(vector([]))) as fp:
            c, _ = client(fp.url, method=method)
            c.query("up", at=100.0, params={**AT_TIME_PARAMS, "query": "down", "time": "1", "timeout": "1s"})
            c.query("up", at=100.0)
        first, plain = (r["params"] for r in fp.requests)
        assert first == {"nocache": ["1"], "query": ["up"], "time": ["100.000"], "timeout": ["10s"]}, method
        assert "nocache" not in plain


def test_empty_result_is_not_an_error_and_scalar_helpers():
    with FakePrometheus(lambda ep, p: ok(vector([]))) as fp:
        res = client(fp.url)[0].query("up")
    assert res.empty and not res.has_nan and res.scalar() is None
    with FakePrometheus(lambda ep, p: ok({"resultType": "scalar", "result": [12.0, "4.5"]})) as fp:
        assert client(fp.url)[0].query("4.5").scalar() == 4.5
    with FakePrometheus(lambda ep, p: ok(vector([({"a": "1"}, 1.0), ({"a": "2"}, 2.0)]))) as fp:
        with pytest.raises(PrometheusResponseError, match="one series"):
            client(fp.url)[0].query("up").scalar()


def test_query_range_parses_matrix_and_validates_range_before_sending():
    data = matrix([({"node": "n1"}, [(100.0, 1.0), (115.0, math.nan)])])
    with FakePrometheus(lambda ep, p: ok(data)) as fp:
        c, _ = client(fp.url, method="GET")
        res = c.query_range("avg(x)", 100.0, 115.0, 15.0)
        with pytest.raises(ValueError):
            c.query_range("avg(x)", 200.0, 100.0, 15.0)
        with pytest.raises(ValueError):
            c.query_range("avg(x)", 100.0, 200.0, 0)
    assert res.series[0].labels == {"node": "n1"}
    assert res.series[0].timestamps == (100.0, 115.0)
    assert res.series[0].values[0] == 1.0 and res.has_nan
    assert len(fp.requests) == 1
    req = fp.requests[0]
    assert req["method"] == "GET" and req["endpoint"] == "query_range"
    assert (req["params"]["start"], req["params"]["end"], req["params"]["step"]) == (["100.000"], ["115.000"], ["15"])


def test_series_sends_every_matcher():
    with FakePrometheus(lambda ep, p: ok([{"__name__": "up", "job": "vllm"}, {"__name__": "up", "job": "dcgm"}])) as fp:
        got = client(fp.url)[0].series(['up{job="vllm"}', 'up{job="dcgm"}'], start=1.0, end=2.0)
    assert got == [{"__name__": "up", "job": "vllm"}, {"__name__": "up", "job": "dcgm"}]
    assert fp.requests[0]["params"]["match[]"] == ['up{job="vllm"}', 'up{job="dcgm"}']
    with pytest.raises(ValueError):
        client("http://127.0.0.1:1")[0].series([])


def test_bearer_token_and_tenant_header():
    with FakePrometheus(lambda ep, p: ok(vector([]))) as fp:
        client(fp.url, bearer_token="s3cret", headers={"X-Scope-OrgID": "team-a"})[0].query("up")
    h = fp.requests[0]["headers"]
    assert h["Authorization"] == "Bearer s3cret"
    assert h["X-Scope-OrgID"] == "team-a"


def test_basic_auth_header():
    with FakePrometheus(lambda ep, p: ok(vector([]))) as fp:
        client(fp.url + "/", basic_auth=("alice", "pw"))[0].query("up")
    assert fp.requests[0]["headers"]["Authorization"] == "Basic " + base64.b64encode(b"alice:pw").decode()


def test_retries_5xx_with_exponential_backoff_then_succeeds():
    answers = [(503, {"status": "error", "errorType": "timeout", "error": "query timed out"}),
               (502, b"bad gateway"), ok(vector([({}, 7.0)]))]
    with FakePrometheus(lambda ep, p: answers.pop(0)) as fp:
        c, slept = client(fp.url, retries=3, backoff=0.5)
        assert c.query("up").scalar() == 7.0
    assert len(fp.requests) == 3
    assert slept == [0.5, 1.0]


def test_5xx_exhausted_raises_unavailable():
    with FakePrometheus(lambda ep, p: (500, {"status": "error", "errorType": "internal", "error": "boom"})) as fp:
        c, slept = client(fp.url, retries=2, backoff=1.0, max_backoff=1.5)
        with pytest.raises(PrometheusUnavailable) as ei:
            c.query("up")
    assert ei.value.attempts == 3 and "HTTP 500" in ei.value.detail and "boom" in ei.value.detail
    assert len(fp.requests) == 3
    assert slept == [1.0, 1.5]


@pytest.mark.parametrize("status,etype", [(400, "bad_data"), (422, "execution")])
def test_query_error_is_typed_and_not_retried(status, etype):
    body = {"status": "error", "errorType": etype, "error": "parse error at char 5"}
    with FakePrometheus(lambda ep, p: (status, body)) as fp:
        c, slept = client(fp.url, retries=3)
        with pytest.raises(PrometheusQueryError) as ei:
            c.query("sum(")
    assert (ei.value.status, ei.value.error_type, ei.value.query) == (status, etype, "sum(")
    assert "parse error" in str(ei.value)
    assert len(fp.requests) == 1 and slept == []


@pytest.mark.parametrize("status,needle", [(401, "bearer token"), (403, "tenant"), (404, "/prometheus")])
def test_auth_and_path_errors_are_not_retried(status, needle):
    with FakePrometheus(lambda ep, p: (status, b"nope")) as fp:
        c, _ = client(fp.url, retries=3)
        with pytest.raises(PrometheusResponseError, match=needle):
            c.query("up")
    assert len(fp.requests) == 1


def test_malformed_answers():
    with FakePrometheus(lambda ep, p: (200, b"<html>proxy login</html>")) as fp:
        with pytest.raises(PrometheusResponseError, match="unexpected answer"):
            client(fp.url)[0].query("up")
    with FakePrometheus(lambda ep, p: ok({"resultType": "streams", "result": []})) as fp:
        with pytest.raises(PrometheusResponseError, match="unsupported resultType"):
            client(fp.url)[0].query("up")
    with FakePrometheus(lambda ep, p: ok({"resultType": "vector", "result": [{"metric": {}, "value": [1, "abc"]}]})) as fp:
        with pytest.raises(PrometheusResponseError, match="not a number"):
            client(fp.url)[0].query("up")


def _dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_connection_refused_is_retried_then_unavailable():
    c, slept = client(f"http://127.0.0.1:{_dead_port()}", retries=2, backoff=0.25)
    with pytest.raises(PrometheusUnavailable) as ei:
        c.query("up")
    assert ei.value.attempts == 3 and "(connection refused)" in ei.value.detail
    assert str(ei.value).startswith("cannot reach Prometheus at http://127.0.0.1:") and "Max retries" not in str(ei.value)
    assert slept == [0.25, 0.5]


def test_read_timeout_is_unavailable():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)  # accepts connections into the backlog but never answers
    try:
        c, _ = client(f"http://127.0.0.1:{s.getsockname()[1]}", timeout=0.2, retries=1)
        with pytest.raises(PrometheusUnavailable) as ei:
            c.query("up")
    finally:
        s.close()
    assert "(timed out)" in ei.value.detail


def test_constructor_validation_and_parse_value():
    with pytest.raises(ValueError):
        PromClient("127.0.0.1:9090")
    with pytest.raises(ValueError):
        PromClient("http://x", method="PUT")
    with pytest.raises(ValueError):
        PromClient("http://x", bearer_token="t", basic_auth=("u", "p"))
    assert parse_value("-Inf") == -math.inf and parse_value("1e3") == 1000.0
    with pytest.raises(PrometheusResponseError):
        parse_value(None)


def test_union_alerts_client_lists_each_alert_once_and_survives_a_dead_member():
    from gpuobs.promapi.alertmanager import AlertApiError, UnionAlertsClient
    from gpuobs.stack.ports import free_port_range
    from tests.fakes.prometheus import FakePrometheus, ok

    xid = {"alertname": "GpuXidCritical", "node": "gpu-node-00", "gpu": "0"}
    skew = {"alertname": "GpuDriverSkew", "modelName": "H100"}

    def replica(state, active):
        return lambda endpoint, params: ok({"alerts": [{"labels": xid, "state": state, "activeAt": active}]})
    vmalert = lambda endpoint, params: ok({"alerts": [{"labels": skew, "state": "pending",  # noqa: E731
                                                       "activeAt": "2026-01-01T00:00:09Z"}]})
    dead = f"http://127.0.0.1:{free_port_range(1)}"
    with FakePrometheus(replica("pending", "2026-01-01T00:00:05Z")) as r0, \
            FakePrometheus(replica("firing", "2026-01-01T00:00:07Z")) as r1, FakePrometheus(vmalert) as va:
        got = UnionAlertsClient([r0.url, r1.url, dead, va.url], timeout_s=2).alerts()
        assert sorted((a["labels"]["alertname"], a["state"]) for a in got) == [
            ("GpuDriverSkew", "pending"), ("GpuXidCritical", "firing")]
        assert r0.requests[0]["endpoint"] == "alerts"
    with pytest.raises(AlertApiError, match="no evaluator answered"):
        UnionAlertsClient([dead], timeout_s=2).alerts()


@pytest.mark.parametrize("status, body, engine", [
    (200, {"status": "success", "data": {"version": "2.42.0", "revision": "225c61122d88b01d1f0eaaee0e05b6f3e0567ac0",
                                          "branch": "HEAD", "buildUser": "root@x", "buildDate": "20230131-13:15:06",
                                          "goVersion": "go1.19.5"}}, True),
    (200, {"status": "success", "data": {}}, False),  # VictoriaMetrics v1.79.5
    (200, {"status": "success", "data": {"version": "2.24.0"}}, False),  # later VictoriaMetrics, for Grafana
    (404, {"status": "error", "error": "not found"}, False),  # a proxy without the endpoint
    (200, {"status": "success", "data": ["odd"]}, False),
])
def test_build_info_tells_prometheus_engine_from_others(status, body, engine):
    from gpuobs.promapi.prometheus import prometheus_engine
    from tests.fakes.prom_fleet import FakeResponse

    class Session:
        def get(self, url, **_):
            assert url == "http://prom:9090/api/v1/status/buildinfo"
            return FakeResponse(status, body, url)

    info = PromClient("http://prom:9090", retries=0, session=Session()).build_info()
    assert prometheus_engine(info) is engine
    assert (info is None) == (status != 200 or not isinstance(body["data"], dict))


def test_build_info_never_raises_on_a_dead_backend():
    import requests as rq

    class Session:
        def get(self, url, **_):
            raise rq.ConnectionError("refused")

    assert PromClient("http://prom:9090", retries=0, session=Session()).build_info() is None
