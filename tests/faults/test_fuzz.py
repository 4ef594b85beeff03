"""Fault suite, part 1: bounded fuzzing of every HTTP surface, with slow clients connected meanwhile.

Each server runs as its own process (``python -m gpuobs ...``, as the stack runs it), so its RSS can
be measured and a crash would be seen. Per surface: ``GPUOBS_FUZZ_CASES`` (default 500; 1500 in
``make test-faults``) seeded
hostile requests (request-line/header/framing abuse, JSON mutations of real payloads, hostile query
values, wrong and missing tokens), early-answer smuggling probes, and 150 idle half-sent
connections held open from the start. What must hold: no 5xx, no hang (every exchange ends within
its deadline), a smuggled inner request is never answered, nothing rejected is stored (pager), the
process is alive and healthy afterwards, RSS grows less than 64 MiB, and the idle connections are
closed by the server (socket timeout) instead of being held forever.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from gpuobs.stack.ports import free_port_range, port_free
from tests.fakes.prometheus import FakePrometheus, fleet
from tests.faults import fuzz
from tests.faults.conftest import record

#: Requests per surface: 500 in `make test`, 1500 in `make test-faults` (GPUOBS_FUZZ_CASES).
CASES = int(os.environ.get("GPUOBS_FUZZ_CASES", "500"))
SLOW_CLIENTS = 150
RSS_GROWTH_LIMIT_KIB = 64 * 1024
SERVER_TIMEOUT_S = 30  # gpuobs.core.httpd.Handler.timeout
#: An exchange without an answer (or close) by then is a hang. Generous: an accepted canary analysis
#: of the longest allowed window is CPU work (seconds), and 8 run at once on a small machine.
DEADLINE_S = 60.0
REPO = Path(__file__).resolve().parents[2]
TOKEN = "fault-suite-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

PAGER_PAYLOAD = {
    "version": "4", "groupKey": '{}/{severity="critical"}:{alertname="GpuXidCritical"}', "truncatedAlerts": 0,
    "status": "firing", "receiver": "page", "groupLabels": {"alertname": "GpuXidCritical"},
    "commonLabels": {"alertname": "GpuXidCritical", "severity": "critical"},
    "commonAnnotations": {"summary": "x"}, "externalURL": "http://127.0.0.1:9093",
    "alerts": [{"status": "firing", "labels": {"alertname": "GpuXidCritical", "Hostname": "gpu-node-00"},
                "annotations": {"runbook_url": "http://127.0.0.1:9097/runbooks/xid.md#gpuxidcritical"},
                "startsAt": "2026-11-30T05:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://127.0.0.1:9090/graph", "fingerprint": "abc"}],
}
FLAGGER = {"name": "vllm", "namespace": "serving", "phase": "Progressing", "checksum": "c1",
           "metadata": {"canary": 'track="canary"', "baseline": 'track="baseline"', "window": "5m"}}
FAULTS = [{"kind": "xid", "gpu": 0, "code": 48}, {"kind": "thermal", "gpu": 1, "cooling_factor": 3.0}]


def _spawn(argv: list[str], port: int, tmp: Path) -> subprocess.Popen:
    log = open(tmp / f"server-{port}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gpuobs", *argv], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=tmp, start_new_session=True)
    deadline = time.monotonic() + 30
    while port_free(port):
        assert proc.poll() is None, (tmp / f"server-{port}.log").read_text()[-2000:]
        assert time.monotonic() < deadline, f"server on {port} did not start"
        time.sleep(0.1)
    return proc


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "token").write_text(TOKEN + "\n")
    base = free_port_range(4)
    fake = FakePrometheus(fleet(ttft_mult=1.2)).__enter__()
    procs = {
        "pager": (_spawn(["pager", "--port", str(base), "--db", str(tmp / "pager.sqlite"), "--token-file",
                          str(tmp / "token"), "--runbooks-dir", str(REPO / "runbooks")], base, tmp), base),
        "canary serve": (_spawn(["canary", "serve", "--port", str(base + 1), "--prometheus", fake.url,
                                 "--retries", "0", "--timeout", "3", "--token-file", str(tmp / "token")],
                                base + 1, tmp), base + 1),
        "exporter": (_spawn(["exporter", "--nodes", "1", "--gpus", "2", "--base-port", str(base + 2),
                             "--engine-base-port", str(base + 3), "--token-file", str(tmp / "token")],
                            base + 2, tmp), base + 2),
    }
    # idle half-sent connections, opened now and held through every surface's fuzz
    slow = {name: (_slow_clients(port, SLOW_CLIENTS), time.monotonic()) for name, (_, port) in procs.items()}
    yield procs, tmp, slow
    for socks, _ in slow.values():
        for s in socks:
            s.close()
    for proc, _ in procs.values():
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    fake.__exit__()


def pager_cases(rng: random.Random) -> list[tuple[bytes, str]]:
    out: list[tuple[bytes, str]] = []
    for i in range(CASES):
        r = rng.random()
        auth = AUTH if rng.random() < 0.7 else rng.choice([{}, {"Authorization": "Bearer wrong"},
                                                           {"Authorization": TOKEN}])
        if r < 0.55:
            channel = rng.choice(["page", "ticket", "page", "sms", "../page", "page/x"])
            k = rng.random()
            if k < 0.7:
                body = json.dumps(fuzz.mutate_json(PAGER_PAYLOAD, rng)).encode()
            elif k < 0.8:  # a new valid notification: must be stored exactly once
                p = json.loads(json.dumps(PAGER_PAYLOAD))
                p["alerts"][0]["fingerprint"] = f"fp{i}"
                body = json.dumps(p).encode()
            elif k < 0.9:
                body = json.dumps(PAGER_PAYLOAD).encode()  # the same notification again: a duplicate
            else:
                body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
            out.append((fuzz.request("POST", f"/hook/{channel}", {**auth, "Content-Type": "application/json"}, body),
                        "hook"))
        elif r < 0.85:
            v = rng.choice(fuzz.HOSTILE_TEXT)
            path = rng.choice([f"/api/pages?limit={v}", f"/api/pages?status={v}&alertname={v}", "/", "/health",
                               f"/runbooks/{v}.md", f"/runbooks/{'a' * rng.randrange(1, 400)}.md",
                               "/runbooks/../pager.sqlite", "/runbooks/%2e%2e%2fpager.sqlite"])
            out.append((fuzz.request(rng.choice(["GET", "GET", "HEAD"]), path.replace(" ", "%20")), "read"))
        else:
            out.append((rng.choice(fuzz.protocol_cases(rng, ["/hook/page", "/api/pages", "/"], AUTH)), "protocol"))
    return out


def canary_cases(rng: random.Random) -> list[tuple[bytes, str]]:
    from urllib.parse import urlencode
    out: list[tuple[bytes, str]] = []
    for _ in range(CASES):
        r = rng.random()
        auth = AUTH if rng.random() < 0.6 else rng.choice([{}, {"Authorization": "Bearer nope"}])
        if r < 0.5:
            params = {}
            for k in ("canary", "baseline", "start", "window", "run"):
                if rng.random() < 0.6:
                    params[k] = rng.choice(fuzz.HOSTILE_TEXT)
            if rng.random() < 0.3:
                params.update(canary='track="canary"', baseline='track="baseline"')
                if rng.random() < 0.5:
                    params["window"] = rng.choice(["5m", "10m", "20m", "1h", "inf"])
            q = urlencode({k: v.encode("utf-8", "surrogateescape") for k, v in params.items()})
            out.append((fuzz.request(rng.choice(["GET", "GET", "HEAD"]), f"/api/v1/analysis?{q}", auth), "analysis"))
        elif r < 0.85:
            path = rng.choice(["/flagger/rollback", "/flagger/confirm-promotion", "/flagger/x"])
            body = json.dumps(fuzz.mutate_json(FLAGGER, rng)).encode() if rng.random() < 0.85 else fuzz.deep(30_000)
            out.append((fuzz.request("POST", path, auth, body), "flagger"))
        else:
            out.append((rng.choice(fuzz.protocol_cases(rng, ["/api/v1/analysis", "/flagger/rollback"], AUTH)), "protocol"))
    return out


def exporter_cases(rng: random.Random) -> list[tuple[bytes, str]]:
    out: list[tuple[bytes, str]] = []
    for _ in range(CASES):
        r = rng.random()
        auth = AUTH if rng.random() < 0.5 else rng.choice([{}, {"Authorization": "Bearer nope"}])
        if r < 0.4:
            body = json.dumps(fuzz.mutate_json(rng.choice(FAULTS), rng)).encode()
            out.append((fuzz.request("POST", "/admin/faults", auth, body), "admin"))
        elif r < 0.5:
            body = json.dumps({"version": rng.choice(fuzz.HOSTILE_VALUES)}).encode()
            out.append((fuzz.request("POST", "/admin/deploy", auth, body), "admin"))
        elif r < 0.6:
            v = rng.choice(fuzz.HOSTILE_TEXT).replace(" ", "%20")
            out.append((fuzz.request("DELETE", f"/admin/faults/{v or 'x'}", auth), "admin"))
        elif r < 0.85:
            v = rng.choice(fuzz.HOSTILE_TEXT).replace(" ", "%20")
            path = rng.choice(["/metrics", "/health", "/admin/faults", "/admin/deploy", f"/admin/kernel-log?since={v}",
                               f"/metrics?x={v}", "/nope"])
            out.append((fuzz.request(rng.choice(["GET", "HEAD"]), path, auth), "read"))
        else:
            out.append((rng.choice(fuzz.protocol_cases(rng, ["/metrics", "/admin/faults"], AUTH)), "protocol"))
    return out


def _slow_clients(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finished
        socks.append(s)
    return socks


def _closed_by_server(socks: list[socket.socket], deadline: float) -> int:
    closed = 0
    for s in socks:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if s.recv(1024) == b"":
                closed += 1
        except OSError:
            closed += 1 if isinstance(sys.exc_info()[1], ConnectionResetError) else 0
        finally:
            s.close()
    return closed


GENERATORS = {"pager": pager_cases, "canary serve": canary_cases, "exporter": exporter_cases}
SMUGGLE = {"pager": ["/hook/page", "/hook/nope"], "canary serve": ["/flagger/rollback", "/flagger/nope"],
           "exporter": ["/admin/faults", "/nope"]}


@pytest.mark.parametrize("surface", list(GENERATORS))
def test_fuzz_surface(servers, surface):
    procs, tmp, slow_clients = servers
    proc, port = procs[surface]
    rng = random.Random(f"gpuobs-fuzz-{surface}")
    cases = GENERATORS[surface](rng)
    # warm up (imports, caches, first analyses), then measure RSS; the warm-up counts like the rest
    warm = [(kind, fuzz.exchange(port, raw, deadline_s=DEADLINE_S, keep=True)) for raw, kind in cases[:50]]
    rss0 = fuzz.rss_kib(proc.pid)
    slow, slow_opened = slow_clients[surface]
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outcomes = warm + list(pool.map(lambda c: (c[1], fuzz.exchange(port, c[0], deadline_s=DEADLINE_S, keep=True)), cases[50:]))
    fuzz_s = time.monotonic() - t0
    # Smuggling: an early answer (401/404) on a request whose body is a request: one response only.
    smuggled = [fuzz.exchange(port, fuzz.smuggle_case(p), deadline_s=10, half_close=False) for p in SMUGGLE[surface]]
    smuggled += [fuzz.exchange(port, fuzz.request("POST", SMUGGLE[surface][0], AUTH, b"GET /health HTTP/1.1\r\n\r\n",
                                                  content_length="999999999"), deadline_s=10, half_close=False)]
    # The idle half-sent connections must have been closed by the server's socket timeout.
    closed = _closed_by_server(slow, slow_opened + SERVER_TIMEOUT_S + 20)
    rss1 = fuzz.rss_kib(proc.pid)

    statuses = [s for _, o in outcomes for s in o.statuses]
    five_xx = [(kind, o.statuses, o.raw[:300], o.bodies) for kind, o in outcomes if any(s >= 500 for s in o.statuses)]
    hung = [(kind, o.raw[:300], o.error) for kind, o in outcomes if o.hung or o.error]  # no answer in time, or not even a connection
    no_answer = sum(1 for _, o in outcomes if not o.statuses)
    smuggle_bad = [o.statuses for o in smuggled if len(o.statuses) != 1]
    alive = proc.poll() is None
    health = "/health" if surface != "canary serve" else "/healthz"
    healthy = alive and requests.get(f"http://127.0.0.1:{port}{health}", timeout=5).status_code == 200
    growth = rss1 - rss0
    n = len(outcomes)
    slowest = max(o.elapsed_s for _, o in outcomes)
    record(surface, f"{n} hostile requests ({fuzz_s:.0f} s, 8 at a time)",
           f"{len(five_xx)} 5xx, {len(hung)} hangs (> {DEADLINE_S:.0f} s), {no_answer} closed unanswered, "
           f"{sum(1 for s in statuses if 400 <= s < 500)} 4xx, slowest {slowest:.1f} s", not five_xx and not hung)
    record(surface, f"{len(smuggled)} smuggling probes (early 401/404/413 with a request as body)",
           f"{len(smuggle_bad)} answered the inner request", not smuggle_bad)
    record(surface, f"{SLOW_CLIENTS} idle half-sent connections during the fuzz",
           f"{closed}/{SLOW_CLIENTS} closed by the server's {SERVER_TIMEOUT_S} s timeout", closed == SLOW_CLIENTS)
    record(surface, "RSS over the fuzz", f"{rss0 / 1024:.0f} -> {rss1 / 1024:.0f} MiB (+{growth / 1024:.1f})",
           growth < RSS_GROWTH_LIMIT_KIB and healthy)
    extra_ok = True
    if surface == "pager":
        accepted = sum(1 for kind, o in outcomes if kind == "hook" and o.statuses == [200]
                       and json.loads(o.bodies[0]).get("duplicate") is False)
        dupes = sum(1 for kind, o in outcomes if kind == "hook" and o.statuses == [200]
                    and json.loads(o.bodies[0]).get("duplicate") is True)
        stored = sqlite3.connect(tmp / "pager.sqlite").execute("SELECT COUNT(*) FROM notifications").fetchone()[0]
        rejected = sum(1 for kind, o in outcomes if kind == "hook" and o.statuses and o.statuses[0] != 200)
        extra_ok = stored == accepted
        record(surface, f"{rejected} rejected + {accepted} new + {dupes} repeated webhook payloads",
               f"{stored} rows stored ({stored - accepted} from rejected or repeated payloads)", extra_ok)
    assert not five_xx, five_xx[:5]
    assert not hung, hung[:5]
    assert not smuggle_bad, smuggle_bad
    assert closed == SLOW_CLIENTS
    assert healthy, f"{surface} died or is unhealthy after the fuzz"
    assert growth < RSS_GROWTH_LIMIT_KIB, f"RSS grew {growth} KiB"
    assert extra_ok


@pytest.mark.parametrize("body", [
    '{"kind":"thermal","gpu":1,"cooling_factor":' + "9" * 400 + "}",   # an int beyond float: was 500
    '{"kind":"thermal","gpu":1,"cooling_factor":1e400}',
    '{"kind":"xid","gpu":' + "9" * 400 + ',"code":48}',
    '{"kind":"xid","gpu":0,"code":' + "9" * 5000 + "}",
])
def test_exporter_admin_rejects_numbers_beyond_float(servers, body):
    procs, _, _ = servers
    _, port = procs["exporter"]
    r = requests.post(f"http://127.0.0.1:{port}/admin/faults", data=body, headers=AUTH, timeout=5)
    assert r.status_code == 400 and len(r.text) < 1000, r.text[:300]
