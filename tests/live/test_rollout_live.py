"""Live: `gpuobs rollout start` end to end on the native stack, through the real Prometheus.

One stack (4 serving nodes x 2 GPUs, default rule profile) serves the module; the tests run in order
on the same fleet: an incompatible release is rejected before any deploy, a bad release (1.6.0,
+20% TTFT in its hidden profile) is rolled back with every node back on 1.4.0, then a good release
(1.5.0) is promoted to every node. Stages 50%,100%: two canary nodes against two baseline nodes;
15 s looks.

Traffic 6 req/s per node (the stack's `rate_rps`, stock 4; the simulated KV cache stays below its
preemption point at 6 with the diurnal peak) and an 8 min stage deadline (= the analysis horizon).
The judge (docs/canary.md) needs ~1,000-1,500 requests per side for its PROMOTE evidence and carries
the 2-vs-2 node-spread assumption, so a healthy stage's length varies. In the product-path bench at
this topology (bench/README.md, "live 2+2 nodes": ttft, itl and error_ratio through Analyzer) the
former 4 req/s and 3 min deadline promoted the good release in 79-84% of stages (this test failed
about 1 run in 6); 4 req/s with 8 min in 99.0%; 6 req/s with 8 min in all of them (median look 8,
2 min). The bad release (+20%) is rolled back in about a minute. A long deadline does not make a
healthy stage wait: the controller promotes at the first PROMOTE. About 4-5 minutes in all.

Each rollout's HTML report is written from ``rollout status --json`` against the real Prometheus: it
shows only its own rollout's data (no query window reaches before it started, though the previous
rollout's canary ran on the same nodes with the same labels just before), its stages numbered as the
CLI prints them, and on the Rejected one the compatibility table and the fleet's version.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from gpuobs.promapi.exporter_admin import AdminClient
from gpuobs.promapi.prometheus import PromClient
from gpuobs.reports.rollout import OVER_TIME, RATE_WINDOW_S, over_time_range, write_rollout_report
from gpuobs.stack.state import StackState
from tests.conftest import live_stack

pytestmark = pytest.mark.live

FLAGS = ["--stages", "50%,100%", "--interval", "15s", "--stage-timeout", "8m", "--settle", "10s", "--bake", "10s"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from live_stack(tmp_path_factory, "rollout-run", nodes=4, gpus=2, training_nodes=0, timeout_s=120,
                          exporter_profile="recommended", rate_rps=6.0)


def rollout(stack: StackState, version: str) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "gpuobs", "rollout", "start", "--run-dir", stack.run_dir,
                        "--version", version, *FLAGS], capture_output=True, text=True, timeout=1200)
    return r.returncode, r.stdout + r.stderr[-3000:]


def versions(stack: StackState) -> dict[str, str]:
    token = stack.token()
    return {h: AdminClient(u.removesuffix("/metrics"), token).version()
            for h, u in zip(stack.hostnames, stack.urls.nodes)}


def vllm_labels(stack: StackState) -> list[dict]:
    path = Path(stack.run_dir) / "prometheus" / "targets" / "vllm-nodes.json"
    return [g["labels"] for g in json.loads(path.read_text())]


def prometheus_versions(stack: StackState, want: str, timeout_s: float = 30) -> list[str]:
    """Versions Prometheus scraped from gpuobs_engine_build_info, once every node reports ``want``."""
    got: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = requests.get(f"{stack.urls.prometheus}/api/v1/query",
                         params={"query": "gpuobs_engine_build_info"}, timeout=5).json()["data"]["result"]
        got = sorted(x["metric"]["version"] for x in r)
        if got == [want] * len(stack.hostnames):
            break
        time.sleep(1)
    return got


class RecordingClient(PromClient):
    """The real client, remembering every query's window: ("range", start, end) or ("instant", span, at)."""

    def __init__(self, url: str):
        super().__init__(url)
        self.windows: list[tuple[str, float, float]] = []

    def query(self, expr, at=None):
        span = re.search(r"\[(\d+)s\]", expr)
        self.windows.append(("instant", float(span.group(1)) if span else 0.0, at))
        return super().query(expr, at)

    def query_range(self, expr, start, end, step):
        self.windows.append(("range", start, end))
        return super().query_range(expr, start, end, step)


def report(stack: StackState, out: Path) -> tuple[dict, str, RecordingClient]:
    """The latest rollout's document, its HTML report (real Prometheus), and the queries it made."""
    r = subprocess.run([sys.executable, "-m", "gpuobs", "rollout", "status", "--run-dir", stack.run_dir, "--json"],
                       capture_output=True, text=True, timeout=60)
    doc = json.loads(r.stdout)
    client = RecordingClient(stack.urls.prometheus)
    path = write_rollout_report({**doc, "prometheus": stack.urls.prometheus}, out, client=client, strict=True)
    text = path.read_text()
    for kind, a, b in client.windows:  # nothing from before this rollout started
        if kind == "range":
            assert a - RATE_WINDOW_S >= doc["started_at"] and b <= doc["ended_at"], (a, b, doc["started_at"])
        else:
            assert b == doc["ended_at"] and b - a >= doc["started_at"], (a, b, doc["started_at"])
    return doc, text, client


def test_incompatible_release_is_rejected_and_nothing_deployed(stack):
    code, out = rollout(stack, "2.0.0")
    assert code == 1, out
    assert re.search(r"Rollout 2\.0\.0-\S+: Rejected \(exit 1\)", out), out
    assert "compatibility gate: gpu-node-00: INCOMPATIBLE (toolkit-min-driver, minor-version-compat" in out
    assert "deploys: none" in out
    assert set(versions(stack).values()) == {"1.4.0"}
    doc, html, _ = report(stack, Path(stack.run_dir) / "reports")
    assert doc["state"] == "Rejected" and doc["baseline_version"] == "1.4.0"
    assert "2.0.0 against 1.4.0" in html and "Compatibility gate" in html and "toolkit-min-driver" in html


def test_bad_release_is_rolled_back(stack):
    code, out = rollout(stack, "1.6.0")
    assert code == 1, out
    assert re.search(r"Rollout 1\.6\.0-\S+: RolledBack \(exit 1\)", out), out
    # 1.6.0 regresses TTFT by 20% and ITL by 5% (exporter/sim/data/behaviour.yaml): either metric
    # judged High is a correct rollback, and which one crosses its bound first is chance
    assert re.search(r"reason: canary analysis ROLLBACK in stage 1/2: (ttft|itl): High \(\+\d", out), out
    assert "stage 1/2: 2/4 node(s) on 1.6.0, deployed gpu-node-00 (1.4.0 -> 1.6.0), gpu-node-01 (1.4.0 -> 1.6.0)" in out
    assert "Canary verdict: ROLLBACK" in out and re.search(r"\n(ttft|itl)\s+High!", out), out
    # said once: the 2-vs-2 node-spread assumption only in the report's header, no look, reason or table
    said = re.findall(r"^assumption: (.+)$", out, re.M)
    assert len(said) <= 1 and all(out.count(a) == 1 for a in said), out
    assert versions(stack) == dict.fromkeys(stack.hostnames, "1.4.0")
    assert all("track" not in labels for labels in vllm_labels(stack))
    assert prometheus_versions(stack, "1.4.0") == ["1.4.0"] * 4
    doc, html, _ = report(stack, Path(stack.run_dir) / "reports")
    assert "1.6.0 against 1.4.0" in html and "<tr><td>1/2</td>" in html
    # its RolledBack notice reaches the console as a ticket, linked to this rollout on its timeline
    # (the rollout command recorded it in <run>/activity.jsonl; the pager reads that file)
    deadline, inc = time.monotonic() + 60, None
    while inc is None and time.monotonic() < deadline:
        incs = requests.get(f"{stack.urls.pager}/api/incidents", params={"channel": "ticket"}, timeout=5).json()
        inc = next((i for i in incs["incidents"] if i["commonLabels"].get("rollout") == doc["id"]), None)
        time.sleep(0.5)
    assert inc is not None, "the RolledBack notice did not reach the console"
    one = requests.get(f"{stack.urls.pager}/api/incidents/{inc['id']}", timeout=5).json()
    assert [(r["kind"], r["id"], r["match"]) for r in one["related"]] == [("rollout", doc["id"], "rollout label")]
    assert "rollout ended" in [e["kind"] for e in one["timeline"]]
    # What it cost: the stage's two canary nodes over the stage's span, printed by the rollout and
    # measured by the pager on the notice's incident; recomputed here from the counters' values at the
    # span's two ends (instant queries).
    printed = re.search(r"^impact: (.+)$", out, re.M)
    assert printed and "serving" in printed.group(1) and re.search(r"\d+ requests? failed", printed.group(1)), out
    imp = requests.post(f"{stack.urls.pager}/api/incidents/{inc['id']}/impact", timeout=60).json()["impact"]
    assert sorted(e["node"] for e in imp["serving"]) == ["gpu-node-00", "gpu-node-01"], imp
    prom = PromClient(stack.urls.prometheus)
    t0, t1 = imp["window"]["start"], imp["window"]["end"]
    for e in imp["serving"]:
        sel = f'job="vllm", node="{e["node"]}"'

        def delta(expr: str) -> float:
            return sum((prom.query(f"sum({expr})", at=t).scalar() or 0.0) * sign for t, sign in ((t1, 1), (t0, -1)))
        assert e["requests"] == round(delta(f"vllm:request_success_total{{{sel}}}")), e
        assert e["failed"] == round(delta(f'vllm:request_success_total{{{sel}, finished_reason="error"}}')), e
        good = delta(f'vllm:time_to_first_token_seconds_bucket{{{sel}, le="2.5"}}')
        assert e["over_ttft_slo"] == round(max(0.0, delta(f"vllm:time_to_first_token_seconds_count{{{sel}}}") - good))
        # goodput lost needs a minute of the node's own data before the stage (the stack here is young)
        assert (e["goodput_lost"] is None) == (e["baseline_seconds"] < 60), e


def test_good_release_is_promoted_to_every_node(stack):
    code, out = rollout(stack, "1.5.0")
    assert code == 0, out
    assert re.search(r"Rollout 1\.5\.0-\S+: Succeeded \(exit 0\)", out), out
    assert re.search(r"stage 1/2 look \d+ \(\d+s = \d+% of the stage\): PROMOTE", out), out
    assert "promoting: baking 10s while watching the SLO-burn page" in out
    assert versions(stack) == dict.fromkeys(stack.hostnames, "1.5.0")
    assert all("track" not in labels for labels in vllm_labels(stack))
    assert prometheus_versions(stack, "1.5.0") == ["1.5.0"] * 4
    # the rollout right before (1.6.0) had its canary on the same nodes with the same labels: the
    # report of this one must not reach back into it
    doc, html, client = report(stack, Path(stack.run_dir) / "reports")
    assert doc["state"] == "Succeeded" and "1.5.0 against 1.4.0" in html and "1.6.0" not in html
    assert "<tr><td>1/2</td>" in html and "<tr><td>2/2</td>" in html
    # each over-time panel whose window fits in the rollout x 2 tracks (a shorter rollout draws the others
    # empty, querying nothing), all inside the rollout (checked in report())
    fits = [p for p in OVER_TIME if over_time_range(doc["started_at"], doc["ended_at"], time.time(), p.window_s)]
    assert len(fits) >= 2 and sum(k == "range" for k, _, _ in client.windows) == 2 * len(fits)
