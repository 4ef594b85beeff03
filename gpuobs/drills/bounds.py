"""The fault-to-page bound of an alert on a running stack: the pipeline a page cannot beat.

A page needs the fault's first sample to be scraped (at most one ``scrape_interval``), an evaluation
that sees it (at most one ``evaluation_interval``), the rule's ``for:`` and Alertmanager's
``group_wait`` for a new group (route-specific: ``ServingEngineDown`` waits 30 s so that its node's
``GpuExporterDown`` can inhibit it). The bound is their sum, read from the stack itself: the loaded
Prometheus config and rules (``/api/v1/status/config``, ``/api/v1/rules``, whose ``duration`` is the
``for:`` in seconds) and Alertmanager's loaded route tree (``/api/v2/status`` ``config.original``;
routing as :func:`group_wait` describes).

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

from gpuobs.core.durations import DurationError, parse_duration


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


#: One Alertmanager matcher (v0.25 ``pkg/labels/parse.go``): a label name, an operator, a value that is
#: double-quoted or bare; several may be joined by commas, in braces or not.
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|[^,}"]*)\s*,?')


def _matchers(route: dict[str, Any]) -> list[tuple[str, str, str]]:
    """A route's matchers as (name, op, value): ``matchers`` strings plus the legacy ``match`` /
    ``match_re`` maps. Raises ValueError for a matcher string it cannot read."""
    out = [(k, "=", str(v)) for k, v in (route.get("match") or {}).items()]
    out += [(k, "=~", str(v)) for k, v in (route.get("match_re") or {}).items()]
    for text in route.get("matchers") or []:
        body = text.strip()
        if body.startswith("{") and body.endswith("}"):
            body = body[1:-1]
        pos = 0
        while pos < len(body):
            m = _MATCHER.match(body, pos)
            if m is None or m.end() == pos:
                raise ValueError(f"cannot read matcher {text!r}")
            value = m.group(3)
            out.append((m.group(1), m.group(2), value[1:-1] if value.startswith('"') else value.strip()))
            pos = m.end()
    return out


def _matches(name: str, op: str, value: str, labels: dict[str, str]) -> bool:
    v = labels.get(name, "")
    if op == "=":
        return v == value
    if op == "!=":
        return v != value
    hit = re.fullmatch(value, v) is not None  # Alertmanager anchors regex matchers
    return hit if op == "=~" else not hit


def group_wait(route: dict[str, Any], labels: dict[str, str], inherited: float = 30.0) -> float:
    """Seconds until the first notification of a new group for an alert with ``labels`` under
    Alertmanager route ``route`` (its config's ``route`` dict): the ``group_wait`` of the route that
    takes it (Alertmanager's default 30 s, inherited by children). As Alertmanager v0.25.0
    ``dispatch/route.go`` ``Route.Match``: children in order, the first matching one takes the alert
    unless it has ``continue: true``, in which case later matching children take it too; the alert's
    first notification then comes from the shortest of their waits. Raises ValueError,
    DurationError or re.error for a route it cannot read."""
    wait = parse_duration(route["group_wait"], "group_wait") if "group_wait" in route else inherited
    waits = []
    for child in route.get("routes") or []:
        if all(_matches(n, o, v, labels) for n, o, v in _matchers(child)):
            waits.append(group_wait(child, labels, wait))
            if not child.get("continue"):
                break
    return min(waits) if waits else wait


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
    try:
        rules = [r for g in groups for r in g.get("rules") or [] if r.get("name") == alertname]
        if not rules:
            return None
        glob = cfg.get("global") or {}
        scrape = parse_duration(glob.get("scrape_interval", "1m"), "scrape_interval")
        evaluation = parse_duration(glob.get("evaluation_interval", "1m"), "evaluation_interval")
        for_s = max(float(r.get("duration") or 0) for r in rules)
        wait = group_wait(am["route"], {"alertname": alertname, **{k: str(v) for k, v in labels.items()},
                                        **{k: str(v) for r in rules for k, v in (r.get("labels") or {}).items()}})
    except (DurationError, KeyError, TypeError, AttributeError, ValueError, re.error):
        return None  # a config this module cannot read (e.g. Prometheus's "500ms"): no bound, no failure
    return PageBound(scrape + evaluation + for_s + wait, scrape, evaluation, for_s, wait)
