"""``gpuobs canary analyze`` exit codes and output, and the ``canary serve`` HTTP endpoint."""

from __future__ import annotations

import argparse
import json
import socket
import threading

import pytest
import requests

from gpuobs.canary.config import load_config
from gpuobs.canary.serve import CanaryServer
from gpuobs.cli import dispatch
from gpuobs.cli.canary import register
from gpuobs.promapi.prometheus import PromClient
from tests.fakes.prometheus import FakePrometheus, fleet


def cli(argv: list[str]) -> int:
    """The canary group alone, its errors mapped to exit codes as the main CLI maps them."""
    parser = argparse.ArgumentParser(prog="gpuobs")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return dispatch(args)


def analyze_args(url: str, *extra: str) -> list[str]:
    return ["canary", "analyze", "--prometheus", url, "--canary", 'track="canary"', "--baseline", 'track="baseline"',
            "--start", "10000", "--end", "10300", "--retries", "0", *extra]


def _dead_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("kw,code,verdict", [({"ttft_mult": 1.2}, 1, "ROLLBACK"),
                                             ({"n_c": 50, "n_b": 950}, 3, "HOLD"),
                                             ({"n_c": 2400, "n_b": 45_600, "err_b": 20}, 0, "PROMOTE")])
def test_analyze_exit_codes_and_json(capsys, kw, code, verdict):
    with FakePrometheus(fleet(**kw)) as fp:
        assert cli(analyze_args(fp.url, "--json")) == code
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == verdict and doc["exit_code"] == code


def test_analyze_table_and_state_file(capsys, tmp_path):
    state = tmp_path / "stage.json"
    with FakePrometheus(fleet(ttft_mult=1.2)) as fp:
        assert cli(analyze_args(fp.url, "--state", str(state), "--metric", "ttft")) == 1
    out = capsys.readouterr().out
    assert out.startswith("Canary verdict: ROLLBACK") and "ttft" in out and "itl" not in out
    assert json.loads(state.read_text())["looks"]["ttft.location"][0][0] == pytest.approx(0.5)


def test_unreachable_prometheus_is_an_error_not_a_verdict(capsys):
    assert cli(analyze_args(_dead_url(), "--json")) == 4  # not 1: that is ROLLBACK
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"verdict": None, "error": json.loads(captured.out)["error"], "exit_code": 4}
    assert "cannot reach Prometheus" in captured.err and "could not judge: backend error" in captured.err


@pytest.mark.parametrize("status", [503, 401])
def test_failing_backend_exits_4_could_not_judge(capsys, status):
    with FakePrometheus(lambda endpoint, params: (status, b"unavailable or unauthorized")) as fp:
        assert cli(analyze_args(fp.url, "--retries", "0")) == 4
    assert "could not judge: backend error" in capsys.readouterr().err


def test_bad_input_exits_2(capsys, tmp_path):
    assert cli(analyze_args("http://127.0.0.1:1", "--metric", "nope")) == 2
    assert cli(["canary", "analyze", "--canary", "canary", "--baseline", 'track="b"']) == 2
    assert cli(["canary", "analyze", "--canary", 'track="c"', "--baseline", 'track="b"', "--window", "5 minutes"]) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("alpha: 0.5\nmetrics: []\n")
    assert cli(analyze_args("http://127.0.0.1:1", "--config", str(bad))) == 2
    assert cli(analyze_args("http://127.0.0.1:1", "--header", "no-colon")) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 5 and "--metric" in err and "--window" in err and "--header" in err


def test_rejected_query_exits_2(capsys):
    body = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    with FakePrometheus(lambda ep, p: (400, body)) as fp:
        assert cli(analyze_args(fp.url)) == 2
    assert "rejected a query" in capsys.readouterr().err


def test_auth_flags_reach_the_backend(tmp_path):
    token = tmp_path / "token"
    token.write_text("abc\n")
    with FakePrometheus(fleet(ttft_mult=1.2)) as fp:
        cli(analyze_args(fp.url, "--bearer-token-file", str(token), "--header", "X-Scope-OrgID: team-a"))
    assert all(r["headers"]["Authorization"] == "Bearer abc" for r in fp.requests)
    assert all(r["headers"]["X-Scope-OrgID"] == "team-a" for r in fp.requests)


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def served():
    """A CanaryServer on a free port in front of a FakePrometheus; yields (base URL, clock, fake)."""
    def start(data):
        fake = FakePrometheus(data).__enter__()
        clock = Clock(10_000.0)
        srv = CanaryServer(("127.0.0.1", 0), PromClient(fake.url, retries=0), load_config(), clock=clock)
        t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        t.start()
        started.append((srv, fake))
        return f"http://127.0.0.1:{srv.server_address[1]}", clock, fake

    started: list = []
    yield start
    for srv, fake in started:
        srv.shutdown()
        srv.server_close()
        fake.__exit__()


SEL = {"canary": 'track="canary"', "baseline": 'track="baseline"'}


def test_serve_argo_web_endpoint_tracks_runs(served):
    url, clock, fake = served(fleet(ttft_mult=1.2))

    def look():
        return requests.get(f"{url}/api/v1/analysis", params={**SEL, "run": "abc123"}, timeout=5)

    first = look()
    assert first.status_code == 200 and first.json()["verdict"] == "HOLD" and first.json()["metrics"] == []
    for _ in range(3):  # Argo looks every interval (30 s); the window grows from the first contact
        clock.t += 30
        answer = look()
    assert answer.status_code == 200 and answer.json()["verdict"] == "ROLLBACK"
    # decided at the first look with a window (30 s); the later looks repeat it (sticky)
    assert answer.json()["end"] - answer.json()["start"] == pytest.approx(30) and answer.json()["run"]["sticky"]
    assert any("[30s]" in r["params"]["query"][0] for r in fake.requests)
    assert not any("[60s]" in r["params"]["query"][0] for r in fake.requests)
    clock.t += 200  # decided: later looks of the run repeat the decision without querying
    n = len(fake.requests)
    sticky = look().json()
    assert sticky["verdict"] == "ROLLBACK" and sticky["run"]["sticky"] and len(fake.requests) == n
    clock.t += 700  # silent for longer than the horizon: the next look starts a new run
    assert look().json()["verdict"] == "HOLD"
    fixed = requests.get(f"{url}/api/v1/analysis", params={**SEL, "window": "5m"}, timeout=5)
    assert fixed.json()["verdict"] == "ROLLBACK" and fixed.json()["end"] - fixed.json()["start"] == 300
    assert requests.get(f"{url}/healthz", timeout=5).json() == {"status": "ok", "runs": 1}


def test_serve_errors(served):
    url, _, _ = served(fleet())
    assert requests.get(f"{url}/api/v1/analysis", timeout=5).status_code == 400
    bad = requests.get(f"{url}/api/v1/analysis", params={**SEL, "window": "soon"}, timeout=5)
    assert bad.status_code == 400 and "window" in bad.json()["error"]
    assert requests.get(f"{url}/nope", timeout=5).status_code == 404
    dead = CanaryServer(("127.0.0.1", 0), PromClient(_dead_url(), retries=0), load_config())
    t = threading.Thread(target=dead.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    try:
        r = requests.get(f"http://127.0.0.1:{dead.server_address[1]}/api/v1/analysis",
                         params={**SEL, "window": "5m"}, timeout=5)
        assert r.status_code == 503 and "cannot reach Prometheus" in r.json()["error"]
    finally:
        dead.shutdown()
        dead.server_close()


def test_serve_flagger_hooks(served):
    url, _, _ = served(fleet(ttft_mult=1.2))
    payload = {"name": "vllm", "namespace": "serving", "phase": "Progressing",
               "metadata": {**SEL, "window": "5m"}}
    rollback = requests.post(f"{url}/flagger/rollback", json=payload, timeout=5)
    assert rollback.status_code == 200 and rollback.json()["verdict"] == "ROLLBACK"
    promote = requests.post(f"{url}/flagger/confirm-promotion", json=payload, timeout=5)
    assert promote.status_code == 403 and promote.json()["verdict"] == "ROLLBACK"
    assert requests.post(f"{url}/flagger/rollback", data=b"{not json", timeout=5).status_code == 400
    assert requests.post(f"{url}/flagger/other", json=payload, timeout=5).status_code == 404
