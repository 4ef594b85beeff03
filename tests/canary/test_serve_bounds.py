"""``canary serve`` bounds and authentication (issue 12): windows against the horizon, inf/NaN at
parsing, hostile Flagger bodies, the bearer token, and the stateless look plan's bounded cost."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import requests

from gpuobs.canary import sequential
from gpuobs.canary.config import load_config
from gpuobs.canary.serve import MAX_WINDOW_HORIZONS, CanaryServer
from gpuobs.promapi.prometheus import PromClient
from tests.fakes.prometheus import FakePrometheus, fleet

TOKEN = "canary-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SEL = {"canary": 'track="canary"', "baseline": 'track="baseline"'}


@pytest.fixture
def server():
    fake = FakePrometheus(fleet(ttft_mult=1.2)).__enter__()
    srv = CanaryServer(("127.0.0.1", 0), PromClient(fake.url, retries=0), load_config(),
                       clock=lambda: 1_000_000.0, token=TOKEN)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", srv, fake
    srv.shutdown()
    srv.server_close()
    fake.__exit__()


def test_analysis_routes_need_the_token_and_healthz_does_not(server):
    url, srv, fake = server
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
        r = requests.get(f"{url}/api/v1/analysis", params={**SEL, "window": "5m"}, headers=headers, timeout=5)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
        p = requests.post(f"{url}/flagger/rollback", json={"metadata": {**SEL, "window": "5m"}}, headers=headers,
                          timeout=5)
        assert p.status_code == 401
    assert fake.requests == [] and srv.store.count() == 0  # nothing analysed, no run registered
    # A 401 drains the body: the next request on the same connection is parsed as its own.
    with requests.Session() as s:
        assert s.post(f"{url}/flagger/rollback", json={"x": 1}, timeout=5).status_code == 401
        assert s.get(f"{url}/healthz", timeout=5).status_code == 200
    ok = requests.get(f"{url}/api/v1/analysis", params={**SEL, "window": "5m"}, headers=AUTH, timeout=5)
    assert ok.status_code == 200 and ok.json()["verdict"] == "ROLLBACK"


@pytest.mark.parametrize("params, field", [
    ({"window": "inf"}, "window"), ({"window": "nan"}, "window"), ({"window": "1e12"}, "window"),
    ({"window": "30d"}, "window"), ({"start": "nan"}, "start"), ({"start": "inf"}, "start"),
    ({"start": "-inf"}, "start"), ({"start": "1"}, "start"), ({"start": "1e308"}, "start"),
    ({"start": "1.8e309"}, "start"), ({"start": "0001-01-01T00:00:00Z"}, "start"),
    ({"start": "9999-12-31T23:59:59"}, "start"), ({"window": "9" * 400 + "s"}, "window"),
])
def test_windows_outside_the_horizon_or_unparseable_are_400(server, params, field):
    url, _, fake = server
    r = requests.get(f"{url}/api/v1/analysis", params={**SEL, **params}, headers=AUTH, timeout=10)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]
    assert fake.requests == []  # refused before any query


def test_the_window_limit_is_named_and_the_longest_allowed_window_is_served(server):
    url, srv, _ = server
    limit = MAX_WINDOW_HORIZONS * srv.config.horizon_s
    r = requests.get(f"{url}/api/v1/analysis", params={**SEL, "window": f"{limit + 1:.0f}"}, headers=AUTH, timeout=5)
    assert r.status_code == 400 and f"{limit:.0f} s" in r.json()["error"]
    ok = requests.get(f"{url}/api/v1/analysis", params={**SEL, "window": f"{limit:.0f}"}, headers=AUTH, timeout=30)
    assert ok.status_code == 200


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"metadata": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001,
    b'{"metadata": {"canary": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
    b'{"metadata": {"window": 1e400}}',
    b'"just a string"',
    b"[1, 2, 3]",
    b'{"metadata": [1]}',
    b'{"name": {"a": 1}}',
])
def test_hostile_flagger_bodies_are_400(server, body):
    url, _, fake = server
    r = requests.post(f"{url}/flagger/rollback", data=body, headers=AUTH, timeout=10)
    assert r.status_code == 400, r.text
    assert fake.requests == []


def test_stateless_look_plan_is_bounded():
    # A window of many intervals is refused, not planned (was: one look per interval since the epoch).
    with pytest.raises(ValueError, match="looks"):
        sequential.planned_looks(1.7e9, 30, 600, 1e6, 50, 1e3)
    for bad in (float("inf"), float("nan"), 0.0):
        with pytest.raises(ValueError):
            sequential.planned_looks(bad, 30, 600, 100, 50, 1.0)
    times, infos = sequential.planned_looks(1200, 30, 600, 1200, 10, 10.0)
    assert len(times) == len(infos) == 40 and times[-1] == 2.0


def test_boundary_cache_holds_only_short_schedules():
    sequential._boundaries.cache_clear()
    spending = sequential.Spending(0.01)
    n = sequential._MAX_CACHED_LOOKS + 1
    times = list(np.linspace(0.001, 1, n))
    sequential.group_sequential_boundaries(spending, times[:5], times[:5])
    assert sequential._boundaries.cache_info().currsize == 1
    sequential.group_sequential_boundaries(spending, times, times)  # computed, not kept
    assert sequential._boundaries.cache_info().currsize == 1
    assert sequential._boundaries.cache_info().maxsize == sequential._CACHE_SIZE
    with pytest.raises(ValueError):
        sequential.group_sequential_boundaries(spending, [0.5, float("nan")], [1.0, 2.0])


def test_flagger_may_carry_the_token_in_metadata(server):
    url, _, fake = server
    body = {"name": "vllm", "namespace": "serving", "metadata": {**SEL, "window": "5m", "token": TOKEN}}
    r = requests.post(f"{url}/flagger/rollback", json=body, timeout=10)
    assert r.status_code == 200 and r.json()["verdict"] == "ROLLBACK"
    body["metadata"]["token"] = "wrong"
    assert requests.post(f"{url}/flagger/rollback", json=body, timeout=10).status_code == 401
    body["metadata"]["token"] = ["not", "a", "string"]
    assert requests.post(f"{url}/flagger/rollback", json=body, timeout=10).status_code == 401
