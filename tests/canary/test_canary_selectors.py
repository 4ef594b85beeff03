"""Named target selectors ($vllm, $dcgm) of the canary config, and why they exist.

Under kube-prometheus a ServiceMonitor's ``job`` is the Service name (docs/real-fleet.md, step 3): vLLM served behind
Service ``vllm-engine-service`` is scraped as ``job="vllm-engine-service"``. The packaged config used
a literal ``job="vllm"``, which selected nothing there, so every look on a real fleet was NoData and
HOLD. Its selectors now default to the fleet config's (prometheus/fleet.yaml).
"""

from __future__ import annotations

import numpy as np
import pytest

from gpuobs.canary.analyzer import Analyzer
from gpuobs.canary.config import DEFAULT_SELECTORS, ConfigError, load_config, parse_config
from gpuobs.exporter.sim.latency import sample_ttft
from gpuobs.core.fleet import DEFAULT_DCGM_SELECTOR, DEFAULT_VLLM_SELECTOR, load_fleet
from gpuobs.promapi.prometheus import PromClient
from gpuobs.reference.buckets import TTFT_BUCKETS
from gpuobs.canary.stats import NODATA
from tests.canary.test_canary_cli import cli
from tests.fakes.prom_fleet import FakeSession, Pod

STEP, END = 15.0, 600.0


def _pods(job: str, rng: np.random.Generator) -> list[Pod]:
    """One canary and three baseline pods of ``job``, 10 min of 15 s scrapes at 2 / 10 req/s."""
    t = np.arange(0.0, END + STEP, STEP)
    out = []
    for track, name, rate in (("canary", "c0", 2.0), ("baseline", "b0", 10.0), ("baseline", "b1", 10.0),
                              ("baseline", "b2", 10.0)):
        per = np.zeros((t.size, len(TTFT_BUCKETS) + 1))
        for i in range(1, t.size):
            x = sample_ttft(rng, int(rng.poisson(rate * STEP)))
            per[i] = np.bincount(np.searchsorted(TTFT_BUCKETS, x, side="left"), minlength=len(TTFT_BUCKETS) + 1)
        n = per.sum(1)
        reasons = np.stack([n, np.zeros_like(n)], 1)
        out.append(Pod({"job": job, "track": track, "instance": name}, t, np.cumsum(np.cumsum(per, 0), 1),
                       np.cumsum(reasons, 0), tuple(TTFT_BUCKETS)))
    return out


def _ttft_code(job: str, config) -> int:
    session = FakeSession(_pods(job, np.random.default_rng(4)))
    client = PromClient("http://fake-prometheus", retries=0, session=session)
    v = Analyzer(client, config.select(["ttft", "error_ratio"]).with_timing(horizon_s=END),
                 'track="canary"', 'track="baseline"').analyze(0.0, END)
    return {r.name: r for r in v.metrics}["ttft"].code


@pytest.mark.parametrize("job", ["vllm", "vllm-engine-service", "monitoring/vllm-podmonitor"])
def test_default_config_selects_vllm_under_its_kube_prometheus_job_names(job):
    assert _ttft_code(job, load_config()) != NODATA


def test_a_literal_job_matcher_would_miss_a_servicemonitor_job():
    """The old packaged matcher, job="vllm", on a ServiceMonitor's job: no data at all."""
    assert _ttft_code("vllm-engine-service", load_config(selectors={"vllm": 'job="vllm"'})) == NODATA


def test_packaged_selectors_are_the_fleet_configs():
    assert DEFAULT_SELECTORS == {"vllm": DEFAULT_VLLM_SELECTOR, "dcgm": DEFAULT_DCGM_SELECTOR}
    fleet = load_fleet("prometheus/fleet.yaml")
    cfg = {m.name: m for m in load_config().metrics}
    assert cfg["ttft"].matchers == fleet.vllm_selector
    assert "{" + fleet.dcgm_selector + ",$selector}" in cfg["sm_active"].query


def _doc(**metric):
    m = {"name": "ttft", "kind": "histogram", "metric": "vllm:time_to_first_token_seconds", "critical": True,
         "allowed_effect": 0.1}
    m.update(metric)
    return {"metrics": [m]}


def test_config_selectors_are_substituted_outside_quotes_only():
    doc = _doc(matchers='$engine, pod=~"vllm-.*$engine"')
    doc["selectors"] = {"engine": 'job="llm-serving"'}
    spec = parse_config(doc).metrics[0]
    assert spec.matchers == 'job="llm-serving", pod=~"vllm-.*$engine"'
    q = parse_config({"metrics": [{"name": "kv", "kind": "series", "critical": True, "allowed_effect": 0.1,
                                   "query": "avg(vllm:kv_cache_usage_perc{$vllm,$selector})"}]}).metrics[0].query
    assert q == 'avg(vllm:kv_cache_usage_perc{' + DEFAULT_VLLM_SELECTOR + ',$selector})'


@pytest.mark.parametrize("doc, field, says", [
    (_doc(matchers="$nope"), "metrics.ttft.matchers", "$dcgm, $vllm"),
    ({**_doc(), "selectors": {"vllm": "job=vllm"}}, "config.selectors.vllm", "label matchers"),
    ({**_doc(), "selectors": {"selector": 'job="x"'}}, "config.selectors", "not 'selector'"),
    ({**_doc(), "selectors": ["vllm"]}, "config.selectors", "a mapping"),
])
def test_bad_selectors_name_the_field(doc, field, says):
    with pytest.raises(ConfigError) as err:
        parse_config(doc)
    assert err.value.field == field and says in str(err.value)


def test_cli_fleet_flag_takes_the_fleets_selectors(tmp_path, capsys):
    """``--fleet FILE`` reads the $vllm/$dcgm selectors from a fleet config; a bad one is exit 2 naming
    --fleet, before any query."""
    from gpuobs.cli.canary import build_config
    import argparse

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("selectors:\n  vllm: 'job=\"llm-serving\"'\n  dcgm: 'job=\"gpu-metrics\"'\n")
    ns = argparse.Namespace(config=None, fleet=str(fleet), metric=None, horizon=None, interval=None, warmup=None)
    cfg = {m.name: m for m in build_config(ns).metrics}
    assert cfg["ttft"].matchers == 'job="llm-serving"'
    assert 'DCGM_FI_PROF_SM_ACTIVE{job="gpu-metrics",$selector}' in cfg["sm_active"].query
    fleet.write_text("selectors:\n  vllm: 'job=vllm'\n")
    code = cli(["canary", "analyze", "--prometheus", "http://127.0.0.1:9", "--canary", 'track="canary"',
                "--baseline", 'track="baseline"', "--fleet", str(fleet)])
    assert code == 2
    assert "--fleet" in capsys.readouterr().err


def _series(query):
    return {"metrics": [{"name": "kv", "kind": "series", "critical": True, "allowed_effect": 0.1, "query": query}]}


def test_placeholders_inside_any_promql_string_literal_are_left_alone():
    q = "label_replace(x{$vllm,$selector, m=~`a$b`}, 'dst', '$1', 'src', '(.*)')"
    got = parse_config(_series(q)).metrics[0].query
    assert got == ("label_replace(x{" + DEFAULT_VLLM_SELECTOR + ",$selector, m=~`a$b`}, 'dst', '$1', 'src', '(.*)')")


def test_selector_placeholder_counts_and_is_filled_outside_quotes_only():
    from gpuobs.canary.config import fill_selector

    with pytest.raises(ConfigError) as err:  # only a quoted value: the query never gets the canary/baseline matchers
        parse_config(_series('avg(x{job="$selector"})'))
    assert err.value.field == "metrics.kv.query"
    assert fill_selector('avg(x{a="$selector",$selector})', 'track="c"') == 'avg(x{a="$selector",track="c"})'


@pytest.mark.parametrize("matchers", ["$vllm,", "{$vllm}", " $vllm , "])
def test_metric_matchers_are_stored_normalised(matchers):
    """Braces or a trailing comma are accepted and dropped: the analyzer joins matchers with "," inside
    its own braces, so a raw '{...}' or ',,' would only fail once the query ran."""
    spec = parse_config(_doc(matchers=matchers)).metrics[0]
    assert spec.matchers == DEFAULT_VLLM_SELECTOR


def test_selector_placeholder_in_matchers_is_refused():
    with pytest.raises(ConfigError) as err:
        parse_config(_doc(matchers="$selector"))
    assert err.value.field == "metrics.ttft.matchers" and "$selector or" not in str(err.value)


def test_yaml_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("alpha: [\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "\n" not in str(err.value) and "line 2, column 1" in str(err.value)
    code = cli(["canary", "analyze", "--prometheus", "http://127.0.0.1:9", "--canary", 'track="canary"',
                "--baseline", 'track="baseline"', "--fleet", str(bad)])
    err_text = capsys.readouterr().err
    assert code == 2 and err_text.count("\n") == 1 and "not valid YAML (line 2" in err_text, err_text


@pytest.mark.parametrize("doc, field, bad", [
    ({**_doc(), "selector": {"vllm": 'job="x"'}}, "config", "selector"),  # a typo would fall back to the defaults
    (_doc(allowed_efect=0.2), "metrics.ttft", "allowed_efect"),
])
def test_unknown_keys_are_refused_not_ignored(doc, field, bad):
    with pytest.raises(ConfigError) as err:
        parse_config(doc)
    assert err.value.field == field and err.value.value == bad
