"""Public dashboards built for dcgm-exporter and for vLLM work unchanged against our exporters.

The PromQL of NVIDIA's dcgm-exporter dashboard (grafana.com 12239, two revisions) and of vLLM's example
dashboard (a V1 and an older V0 revision) is kept, with its source commit, in
tests/data/public_dashboard_queries.json. Every metric those expressions select must be on our pages
(rendered in-process from gpuobs.exporter collectors, with the labels Prometheus adds at scrape time),
every label they match on must be on that metric, and every label their template variables list must
exist, except for the metrics listed, with the reason, in tests/fakes/dashboards.py: names vLLM
removed upstream (we deliberately do not emit them) and V1 metrics our engine does not simulate yet.
tests/live/test_dashboards_live.py runs the same expressions against a live Prometheus.
"""

from __future__ import annotations

import re

import pytest

from tests.fakes.dashboards import (
    DELIBERATELY_ABSENT,
    NOOP_GROUPING,
    NOT_YET_EMITTED,
    emitted_labels,
    exporter_inventory,
    histogram_base,
    load_public,
    parse_label_values,
    promql_refs,
)

SOURCES = load_public()


@pytest.fixture(scope="module")
def inventory() -> dict[str, dict[str, set[str]]]:
    return exporter_inventory()


def substitute(expr: str) -> str:
    """Grafana variables -> placeholder values (the check is about names, not values)."""
    expr = re.sub(r"\$__\w+", "1m", expr)
    return re.sub(r"\$\{?\w+\}?", "x", expr)


def selectors(source: dict):
    for expr in source["expressions"]:
        refs = promql_refs(substitute(expr))
        assert refs.selectors, f"no metric selector found in {expr!r}"
        for sel in refs.selectors:
            yield expr, refs, sel


def test_data_file_names_its_sources():
    assert {s["repo"] for s in SOURCES} == {"NVIDIA/dcgm-exporter", "vllm-project/vllm"}
    for s in SOURCES:
        assert re.fullmatch(r"[0-9a-f]{40}", s["commit"]), s["id"]
        assert s["path"].endswith(".json") and s["expressions"] and s["job"] in ("dcgm", "vllm")
    assert len({s["id"] for s in SOURCES}) == len(SOURCES)


@pytest.mark.parametrize("source", SOURCES, ids=[s["id"] for s in SOURCES])
def test_every_selected_metric_and_matched_label_is_on_our_pages(source, inventory):
    page = inventory[source["job"]]
    problems = []
    for expr, _refs, sel in selectors(source):
        assert sel.name, f"{expr!r}: selector without a metric name"
        if histogram_base(sel.name) in DELIBERATELY_ABSENT or histogram_base(sel.name) in NOT_YET_EMITTED:
            continue
        if sel.name not in page:
            problems.append(f"{sel.name} is not on our {source['job']} page ({expr!r})")
            continue
        for label in sel.label_names() - page[sel.name]:
            problems.append(f"{sel.name} has no label {label!r} ({expr!r})")
    assert problems == []


@pytest.mark.parametrize("source", SOURCES, ids=[s["id"] for s in SOURCES])
def test_grouping_labels_exist_on_the_grouped_metrics(source, inventory):
    page = inventory[source["job"]]
    problems = []
    for expr in source["expressions"]:
        refs = promql_refs(substitute(expr))
        labels = set().union(*(page.get(s.name, set()) for s in refs.selectors if s.name))
        if not labels:  # only absent metrics: reported by the metric test
            continue
        for g in refs.grouping - labels - set(NOOP_GROUPING):
            problems.append(f"grouping label {g!r} is on none of {sorted(refs.metrics())} ({expr!r})")
    assert problems == []


@pytest.mark.parametrize("source", SOURCES, ids=[s["id"] for s in SOURCES])
def test_template_variables_find_values_on_our_pages(source, inventory):
    page = inventory[source["job"]]
    for name, var in source["variables"].items():
        sel_text, label = parse_label_values(var["query"])
        if sel_text is None:  # label_values(label): any series
            assert any(label in labels for labels in page.values()), f"${name}: no series has {label!r}"
            continue
        sel_text = substitute(sel_text)
        (sel,) = promql_refs(sel_text).selectors
        if sel.name:
            assert label in page[sel.name], f"${name}: {sel.name} has no label {label!r}"
        else:  # {__name__=~"vllm:.*"}
            (rx,) = [v for lbl, op, v in sel.matchers if lbl == "__name__" and op == "=~"]
            hits = [n for n in page if re.fullmatch(rx, n)]
            assert hits and all(label in page[n] for n in hits), f"${name}: {rx} series lack {label!r}"


def test_the_documented_gaps_are_exactly_what_the_public_dashboards_miss(inventory):
    """Each listed metric is referenced by a public dashboard and really absent (a stale entry fails)."""
    emitted = emitted_labels(inventory)
    referenced = {histogram_base(sel.name) for s in SOURCES for _e, _r, sel in selectors(s)}
    missing = {histogram_base(n) for s in SOURCES for _e, _r, sel in selectors(s)
               for n in [sel.name] if n not in emitted}
    assert missing == set(DELIBERATELY_ABSENT) | set(NOT_YET_EMITTED)
    assert set(DELIBERATELY_ABSENT) <= referenced and set(NOT_YET_EMITTED) <= referenced
    # The V0 names appear only in the older vLLM revision: the current one is fully V1.
    v1 = next(s for s in SOURCES if s["id"] == "vllm-example-v1")
    v1_metrics = {histogram_base(sel.name) for _e, _r, sel in selectors(v1)}
    assert not v1_metrics & set(DELIBERATELY_ABSENT)
    # The one grouping no-op: NVIDIA's dashboard groups by lowercase uuid, a label no dcgm-exporter series has.
    grouped = set().union(*(promql_refs(substitute(e)).grouping for s in SOURCES for e in s["expressions"]))
    assert set(NOOP_GROUPING) <= grouped
    assert not any(set(NOOP_GROUPING) & labels for labels in emitted.values())
    # Their V1 replacements are on our page.
    for name in ("vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:request_time_per_output_token_seconds_bucket"):
        assert name in inventory["vllm"]


def test_dcgm_dashboards_need_nothing_we_do_not_emit(inventory):
    """Both revisions of NVIDIA's dashboard are fully covered: no gap entry comes from them."""
    for s in SOURCES:
        if s["job"] != "dcgm":
            continue
        metrics = {sel.name for _e, _r, sel in selectors(s)}
        assert metrics <= set(inventory["dcgm"]), metrics - set(inventory["dcgm"])
        assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED"} <= metrics
