"""The fault-to-page bound of an alert on a running stack: the pipeline a page cannot beat.

A page needs the fault's first sample to be scraped (at most one ``scrape_interval``), an evaluation
that sees it (at most one ``evaluation_interval``), the rule's ``for:`` and Alertmanager's
``group_wait`` for a new group (route-specific: ``ServingEngineDown`` waits 30 s so that its node's
``GpuExporterDown`` can inhibit it). The bound is their sum, read from the stack itself: the loaded
Prometheus config and rules (``/api/v1/status/config``, ``/api/v1/rules``, whose ``duration`` is the
``for:`` in seconds) and Alertmanager's loaded route tree (``/api/v2/status`` ``config.original``;
routing as Alertmanager v0.25.0 ``dispatch/route.go`` ``Route.Match``: depth first, the first matching
child unless ``continue``; a child inherits ``group_wait``).

It is the bound for a condition that is true at the fault's first sample (an Xid line, a DBE, a
target down). Conditions that need a stretch of data first (a violation rate over 2 minutes, a GPU
gone for ``GAP_TOLERANCE``, an error budget burning over an hour) page later by design, by up to that
stretch; docs/drills.md lists them. Nothing here raises: a part that cannot be read makes the bound
None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import requests
import yaml

from gpuobs.core.durations import parse_duration


@dataclass(frozen=True)
class PageBound:
    """``seconds``: scrape + evaluation + for + group_wait, each part in seconds."""

    seconds: float
    scrape_s: float
    evaluation_s: float
    for_s: float
    group_wait_s: float

    def text(self) -> str:
        """``15s (5+5+0+5)``: the bound and its parts (scrape + evaluation + for + group_wait)."""
        return f"{self.seconds:g}s ({self.scrape_s:g}+{self.evaluation_s:g}+{self.for_s:g}+{self.group_wait_s:g})"


def _matches(matcher: str, labels: dict[str, str]) -> bool:
    m = re.fullmatch(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"(.*)"\s*', matcher)
    if m is None:
        return False
    name, op, value = m.groups()
    v = labels.get(name, "")
    if op == "=":
        return v == value
    if op == "!=":
        return v != value
    hit = re.fullmatch(value, v) is not None
    return hit if op == "=~" else not hit


def group_wait(route: dict[str, Any], labels: dict[str, str], inherited: float = 30.0) -> float:
    """Seconds of ``group_wait`` for an alert with ``labels`` under Alertmanager route ``route``
    (its config's ``route`` dict; Alertmanager's default group_wait is 30 s)."""
    wait = parse_duration(route["group_wait"], "group_wait") if "group_wait" in route else inherited
    for child in route.get("routes") or []:
        if all(_matches(m, labels) for m in child.get("matchers") or []):
            return group_wait(child, labels, wait)
    return wait


def page_bound(prometheus: str, alertmanager: str, alertname: str, labels: dict[str, str],
               timeout_s: float = 5.0) -> PageBound | None:
    """The bound for ``alertname`` (with alert ``labels``: severity, family...) on the stack whose
    Prometheus and Alertmanager are at those base URLs; None when a part cannot be read."""
    try:
        cfg = yaml.safe_load(requests.get(f"{prometheus}/api/v1/status/config", timeout=timeout_s)
                             .json()["data"]["yaml"])
        groups = requests.get(f"{prometheus}/api/v1/rules", params={"type": "alert"},
                              timeout=timeout_s).json()["data"]["groups"]
        am = yaml.safe_load(requests.get(f"{alertmanager}/api/v2/status", timeout=timeout_s)
                            .json()["config"]["original"])
    except (requests.RequestException, ValueError, KeyError, TypeError, yaml.YAMLError):
        return None
    rules = [r for g in groups for r in g["rules"] if r.get("name") == alertname]
    if not rules:
        return None
    glob = cfg.get("global") or {}
    scrape = parse_duration(glob.get("scrape_interval", "1m"), "scrape_interval")
    evaluation = parse_duration(glob.get("evaluation_interval", "1m"), "evaluation_interval")
    for_s = max(float(r.get("duration") or 0) for r in rules)
    wait = group_wait(am["route"], {"alertname": alertname, **{k: str(v) for k, v in labels.items()},
                                    **{k: str(v) for r in rules for k, v in (r.get("labels") or {}).items()}})
    return PageBound(scrape + evaluation + for_s + wait, scrape, evaluation, for_s, wait)
