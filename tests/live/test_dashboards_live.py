"""Live: every dashboard panel's PromQL returns data on the native stack (the proof without Grafana).

The module starts its own stack (3 nodes x 2 GPUs, one of them training), then runs every panel
target of grafana/dashboards/*.json against Prometheus's /api/v1/query twice: with each template
variable set to a real value found by the variable's own label_values query (the first, as Grafana
preselects it), and with every variable on All (``.*``). Grafana's built-in intervals are fixed:
$__rate_interval 1m, $__interval 15s, $__range 5m. Each query must succeed and return at least one
series. Panels that need more than a healthy fleet get it from the test, as listed in SETUP; queries
that cannot have data on this stack are in ALLOW_NO_DATA, with the reason, and must still be valid.
The public dashboards' expressions (tests/data/public_dashboard_queries.json) run the same way.
"""

from __future__ import annotations

import io
import math
import re
import time
from dataclasses import dataclass

import pytest
import requests

from gpuobs.promapi.exporter_admin import AdminClient
from gpuobs.stack import supervisor
from gpuobs.stack.render import Ports, write_targets
from tests.conftest import free_port_range
from tests.fakes.dashboards import (
    DELIBERATELY_ABSENT,
    NOT_YET_EMITTED,
    histogram_base,
    load_dashboards,
    load_public,
    panel_targets,
    parse_label_values,
    promql_refs,
    variable_query,
    variables,
)
from tests.polling import poll

pytestmark = pytest.mark.live

TIME_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}
#: Seconds from the stack being up until every panel must have data: 1m rate windows fill within a few
#: 5 s scrapes; the SLO error-budget group evaluates once a minute.
DATA_DEADLINE_S = 100

#: What the fixture adds to the healthy simulated fleet so that these panels have data too.
SETUP = {
    ("gpuobs-fleet", 3): "Xid timeline: a repeating Xid 13 (application class) on gpu-node-00 GPU 0; a healthy "
                         "fleet has no Xid in the exporter's window",
    ("gpuobs-memory", 3): "time to OOM exists only while reserved memory grows: fragmentation on gpu-node-00 GPU 0",
    ("gpuobs-release", None): "canary vs baseline select track=canary|baseline: the fixture labels gpu-node-00's "
                              "targets canary and gpu-node-01's baseline, as the rollout controller does",
}
#: Queries that cannot return data on this stack; they must still be valid PromQL (status success).
ALLOW_NO_DATA = {
    "changes((count by (version) (gpuobs_engine_build_info))[1m:15s]) > 0":
        "Release annotation: it marks deploys (the number of nodes per engine version changing); this stack "
        "deploys nothing (at most it marks the engines coming up at start-up)",
}


@dataclass
class Live:
    prom: str
    hosts: list[str]
    deadline: float
    relabelled_at: float


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    base = free_port_range(8)
    ports = Ports(prometheus=base, alertmanager=base + 1, pager=base + 2, node_base=base + 3, engine_base=base + 6)
    run = tmp_path_factory.mktemp("run")
    cfg = supervisor.StackConfig(run_dir=run, nodes=3, gpus=2, training_nodes=1, ports=ports, timeout_s=90,
                                 exporter_profile="recommended")  # today's panels read enhanced fields
    out = io.StringIO()
    state = supervisor.up(cfg, out=out)
    try:
        hosts = state.hostnames
        admin = AdminClient(f"http://127.0.0.1:{ports.node_base}", state.token())
        admin.inject({"kind": "xid", "gpu": 0, "code": 13, "repeat_s": 5})
        admin.inject({"kind": "fragmentation", "gpu": 0})
        # Relabel only once the fragmenting GPU's reserved memory has grown under its old labels, so
        # the range queries hold old and new growing series side by side (as after a real rollout's
        # relabel mid-incident); a one-to-one match on them then fails as many-to-many.
        poll("the fragmenting GPU's reserved memory growing under its old labels",
             lambda: query(state.urls.prometheus,
                           f'deriv(pytorch_cuda_memory_reserved_bytes{{node="{hosts[0]}",gpu="0"}}[5m]) > 0')["result"],
             60, every_s=1.0)
        track = {hosts[0]: {"track": "canary"}, hosts[1]: {"track": "baseline"}}
        write_targets(run, "dcgm", [(h, ports.node_base + i, track.get(h, {})) for i, h in enumerate(hosts)])
        write_targets(run, "vllm", [(h, ports.engine_base + i, track.get(h, {})) for i, h in enumerate(hosts[:2])])
        relabelled_at = time.time()
        yield Live(state.urls.prometheus, hosts, time.monotonic() + DATA_DEADLINE_S, relabelled_at)
    finally:
        supervisor.down(run, out=out)


# ---- Grafana's part, done by hand -----------------------------------------------------------------------
def regex_escape(value: str) -> str:
    """How Grafana's Prometheus datasource escapes a multi-value variable's value inside a regex matcher."""
    return re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m.group(), value)


def interpolate(expr: str, values: dict[str, str]) -> str:
    for k, v in TIME_VARS.items():
        expr = expr.replace(k, v)
    out = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values[m.group(1) or m.group(2)], expr)
    assert "$" not in out, out
    return out


def query(prom: str, expr: str) -> dict:
    doc = requests.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert doc["status"] == "success", f"{expr!r}: {doc.get('errorType')}: {doc.get('error')}"
    return doc["data"]


def label_values(prom: str, query_text: str, values: dict[str, str]) -> list[str]:
    """What Grafana lists for ``label_values(<selector>, <label>)``: the label's values on matching series."""
    sel, label = parse_label_values(query_text)
    params: dict = {"start": time.time() - 300}
    if sel:
        params["match[]"] = interpolate(sel, values)
    doc = requests.get(f"{prom}/api/v1/label/{label}/values", params=params, timeout=10).json()
    assert doc["status"] == "success", doc
    return doc["data"]


def resolve(prom: str, dash_vars: list[tuple[str, str, bool]], deadline: float) -> dict[str, dict[str, str]]:
    """Variable values for both modes: ``one`` (first value of each variable's own query, in order) and
    ``all`` (``.*`` for multi-value variables; a single-value one has no All and keeps its value).
    ``dash_vars``: (name, label_values query, multi)."""
    one: dict[str, str] = {}
    for name, q, multi in dash_vars:
        while not (vals := label_values(prom, q, one)) and time.monotonic() < deadline:
            time.sleep(2)
        assert vals, f"variable ${name}: {q} lists no value"
        one[name] = regex_escape(vals[0]) if multi else vals[0]
    return {"one": one, "all": {name: ".*" if multi else one[name] for name, _q, multi in dash_vars}}


def wait_for_data(prom: str, items: list[tuple[str, str]], deadline: float) -> list[str]:
    """Run ``(label, expr)`` queries until each returned a series or the deadline passed; the failures."""
    pending = list(items)
    while True:
        pending = [(label, e) for label, e in pending if not query(prom, e)["result"]]
        if not pending or time.monotonic() > deadline:
            return [f"{label}: {e}" for label, e in pending]
        time.sleep(5)


def dashboard_vars(dash: dict) -> list[tuple[str, str, bool]]:
    return [(v["name"], variable_query(v), bool(v.get("multi") or v.get("includeAll")))
            for v in variables(dash) if v["type"] == "query"]


def values_for(live: Live, dash: dict) -> dict[str, dict[str, str]]:
    modes = resolve(live.prom, dashboard_vars(dash), live.deadline)
    for m in modes.values():
        m["datasource"] = "prometheus"
    return modes


DASHBOARDS = load_dashboards()


# ---- tests ----------------------------------------------------------------------------------------------
def test_template_variables_list_the_simulated_fleet(live):
    got = {}
    for dash in DASHBOARDS.values():
        one: dict[str, str] = {}
        for name, q, _multi in dashboard_vars(dash):
            deadline = time.monotonic() + 30
            while not (vals := label_values(live.prom, q, one)) and time.monotonic() < deadline:
                time.sleep(2)
            got[(dash["uid"], name)] = vals
            one[name] = regex_escape(vals[0]) if vals else ""
    serving, training = live.hosts[:2], live.hosts[2:]
    assert got[("gpuobs-fleet", "node")] == live.hosts
    assert got[("gpuobs-fleet", "gpu")] == ["0", "1"]  # of the first host, as Grafana preselects it
    assert got[("gpuobs-memory", "node")] == live.hosts
    assert got[("gpuobs-serving", "model_name")] == ["meta-llama/Llama-3.1-70B-Instruct"]
    assert got[("gpuobs-serving", "node")] == serving
    assert got[("gpuobs-training", "node")] == training
    assert got[("gpuobs-training", "gpu")] == ["0", "1"]
    assert got[("gpuobs-release", "model_name")] == got[("gpuobs-serving", "model_name")]


def test_every_rule_still_evaluates_after_targets_are_relabelled(live):
    """The fixture relabelled targets (track=canary/baseline) once their series had samples, as a
    rollout does: range vectors now hold old and new series of the same GPU side by side. Every rule
    must keep evaluating (a one-to-one match on them fails as many-to-many, silently: the rule's last
    output stays visible for 5 minutes, then nothing)."""
    since = live.relabelled_at + 10  # file_sd refresh (5s) and a scrape under the new labels

    def evaluated_since():
        """The rule groups once every 5 s group has run since the relabel; the 1-minute SLO group
        (aggregates only) is checked for health as it stands, not waited for."""
        groups = requests.get(f"{live.prom}/api/v1/rules", timeout=10).json()["data"]["groups"]
        stale = [r["name"] for g in groups if g["interval"] <= 15 for r in g["rules"]
                 if not r.get("lastEvaluation") or _rfc3339(r["lastEvaluation"]) < since]
        return None if stale else groups
    groups = poll("every 5 s rule group evaluated since the relabel", evaluated_since, 90, every_s=2.0)
    rules = [(g["name"], r) for g in groups for r in g["rules"]]
    fast = {g["name"] for g in groups if g["interval"] <= 15}
    assert [(g, r["name"], r.get("health"), r.get("lastError")) for g, r in rules
            if r.get("health") == "err" or (g in fast and r.get("health") != "ok")] == []


def _rfc3339(text: str) -> float:
    """Prometheus's rule API timestamp (RFC 3339 with nanoseconds, e.g. 2026-12-01T21:40:01.123456789Z) as epoch s."""
    from datetime import datetime

    head, _, frac = text.rstrip("Z").partition(".")
    zone = "+00:00"
    if "+" in frac or "-" in frac:
        cut = max(frac.find("+"), frac.find("-"))
        frac, zone = frac[:cut], frac[cut:]
    return datetime.fromisoformat(f"{head}{zone}").timestamp() + float(f"0.{frac or 0}")


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_query_returns_data(live, name):
    dash = DASHBOARDS[name]
    modes = values_for(live, dash)
    items = []
    for p, t in panel_targets(dash):
        if t["expr"] in ALLOW_NO_DATA:
            continue
        for mode, values in modes.items():
            items.append((f"panel {p['id']} {p['title']!r} {t['refId']} ({mode})", interpolate(t["expr"], values)))
    assert len(items) >= 2 * len(panel_targets(dash)) - 2
    assert wait_for_data(live.prom, items, live.deadline) == []


def test_annotation_queries_are_valid_and_allow_listed_ones_documented(live):
    for dash in DASHBOARDS.values():
        for a in dash["annotations"]["list"]:
            if "expr" not in a:
                continue
            assert a["expr"] in ALLOW_NO_DATA, f"{dash['uid']}: annotation {a['name']!r} must have data or a reason"
            data = query(live.prom, interpolate(a["expr"], {}))
            # Valid, and anything it marks is a version change: here only the nodes' engines appearing
            # at start-up (this stack deploys nothing), each on the catalogue's default version.
            assert data["resultType"] == "vector"
            assert {r["metric"].get("version") for r in data["result"]} <= {"1.4.0"}
    used = {t["expr"] for d in DASHBOARDS.values() for _p, t in panel_targets(d)}
    used |= {a["expr"] for d in DASHBOARDS.values() for a in d["annotations"]["list"] if "expr" in a}
    assert set(ALLOW_NO_DATA) <= used, "stale ALLOW_NO_DATA entry"
    for uid, pid in SETUP:
        dash = next(d for d in DASHBOARDS.values() if d["uid"] == uid)
        assert pid is None or any(p["id"] == pid for p in dash["panels"])


def _panel(uid: str, pid: int) -> dict:
    dash = next(d for d in DASHBOARDS.values() if d["uid"] == uid)
    return next(p for p in dash["panels"] if p["id"] == pid)


def _series(live: Live, uid: str, pid: int, ref: str = "A", values: dict | None = None) -> list[dict]:
    (t,) = [t for t in _panel(uid, pid)["targets"] if t["refId"] == ref]
    vals = {"node": ".*", "gpu": ".*", "model_name": ".*", "datasource": "prometheus", **(values or {})}
    expr = interpolate(t["expr"], vals)
    deadline = max(live.deadline, time.monotonic() + 10)
    while not (res := query(live.prom, expr)["result"]) and time.monotonic() < deadline:
        time.sleep(3)
    return res


def test_panel_values_describe_the_simulated_fleet(live):
    # Missing GPUs: every node reports all it should.
    missing = {r["metric"]["node"]: float(r["value"][1]) for r in _series(live, "gpuobs-fleet", 2)}
    assert missing == {h: 0.0 for h in live.hosts}
    assert float(_series(live, "gpuobs-fleet", 10, "A")[0]["value"][1]) == 3.0  # DCGM exporters up
    assert [float(r["value"][1]) for r in _series(live, "gpuobs-fleet", 11)] == [1.0]  # one driver version
    # Health table: 2 GPUs reporting and 2 expected per node, on the default driver.
    rows = _series(live, "gpuobs-fleet", 1, "A")
    assert {(r["metric"]["node"], r["metric"]["DCGM_FI_DRIVER_VERSION"], r["value"][1]) for r in rows} == \
        {(h, "550.54.15", "2") for h in live.hosts}
    # The injected Xid 13 is the only code on the timeline; GPUs without an Xid in the window add
    # dcgm-exporter's 0-valued series without an `xid` label (expcollector.go), summed into one 0 row.
    timeline = {r["metric"].get("xid"): float(r["value"][1]) for r in _series(live, "gpuobs-fleet", 3)}
    assert set(timeline) - {None} == {"13"} and timeline["13"] > 0 and timeline.get(None, 0.0) == 0.0
    # Utilisation vs SM active: both ratios in 0..1, and GPU_UTIL reads above SM active (the lie).
    util = {(r["metric"]["node"], r["metric"]["gpu"]): float(r["value"][1])
            for r in _series(live, "gpuobs-fleet", 8, "A")}
    sm = {(r["metric"]["node"], r["metric"]["gpu"]): float(r["value"][1])
          for r in _series(live, "gpuobs-fleet", 8, "B")}
    assert set(util) == set(sm) and len(util) == 6
    assert all(0 <= v <= 1 for v in [*util.values(), *sm.values()])
    assert all(util[k] > sm[k] for k in util)
    # Time to OOM only for the fragmenting GPU, and finite.
    oom = _series(live, "gpuobs-memory", 3)
    assert {(r["metric"]["node"], r["metric"]["gpu"]) for r in oom} == {(live.hosts[0], "0")}
    assert 0 < float(oom[0]["value"][1]) < math.inf
    # Release: both tracks present with the default engine version.
    versions = {(r["metric"]["track"], r["value"][1]) for r in _series(live, "gpuobs-release", 1)}
    assert versions == {("canary", "1"), ("baseline", "1")}
    ttft = {r["metric"]["track"]: float(r["value"][1]) for r in _series(live, "gpuobs-release", 2)}
    assert set(ttft) == {"canary", "baseline"} and all(0 < v < 2.5 for v in ttft.values())
    # Serving: KV usage is a ratio, error budget remaining at most 1.
    assert all(0 <= float(r["value"][1]) <= 1 for r in _series(live, "gpuobs-serving", 8, "A"))
    assert all(float(r["value"][1]) <= 1 for r in _series(live, "gpuobs-serving", 6))
    # Training: MFU of a healthy job near its design point.
    mfu = _series(live, "gpuobs-training", 1, "A")
    assert [r["metric"]["training_job"] for r in mfu] == ["llama3-70b-pretrain"]
    assert 0.3 < float(mfu[0]["value"][1]) < 0.5


def test_public_dashboards_work_unchanged(live):
    """NVIDIA's and vLLM's dashboards, their variables resolved on our data: every expression has data,
    except those selecting a metric documented as deliberately absent or not emitted yet."""
    gaps = set(DELIBERATELY_ABSENT) | set(NOT_YET_EMITTED)
    items, expect_empty = [], []
    for src in load_public():
        dash_vars = [(n, v["query"], v["multi"]) for n, v in src["variables"].items()]
        modes = resolve(live.prom, dash_vars, live.deadline)
        for expr in src["expressions"]:
            names = {histogram_base(s.name) for s in promql_refs(re.sub(r"\$\{?\w+\}?", "x", expr)).selectors}
            for mode, values in modes.items():
                q = interpolate(expr, values)
                (expect_empty if names & gaps else items).append((f"{src['id']} ({mode})", q))
    assert len(items) > 100
    assert wait_for_data(live.prom, items, live.deadline) == []
    for label, q in expect_empty:
        assert query(live.prom, q)["result"] == [], f"{label}: {q} has data: drop it from the gap lists"
