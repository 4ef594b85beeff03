"""Canary analysis configuration: the metrics YAML, durations and label-selector validation.

The default file is ``gpuobs/canary/data/metrics.yaml`` (its header documents every field). Errors
raise :class:`ConfigError` naming the field, the value and what is accepted, so the CLI can print one
line and exit 2.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpuobs.canary.sequential import Spending
from gpuobs.core.durations import DurationError, parse_duration  # noqa: F401  (the canary CLI and serve parse durations here too)
from gpuobs.core.errors import ConfigError, yaml_problem  # noqa: F401  (re-exported: the canary's input error)
from gpuobs.core.fleet import DEFAULT_DCGM_SELECTOR, DEFAULT_VLLM_SELECTOR

KINDS = ("histogram", "errors", "series")
DIRECTIONS = ("increase", "decrease", "either")
SCALES = ("relative", "absolute")
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_SELECTOR = re.compile(rf"^{_MATCHER}(?:,{_MATCHER})*,?\s*$")
_METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTILE_TEST = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")
# Tests of a latency (histogram) metric and their default shares of the metric's alpha
# (docs/canary.md, "Quantile and spread tests"): location = shift of the mean log latency,
# spread = ratio of the within-node log-latency standard deviations, pNN = share of canary requests
# above the baseline's NN-th percentile bucket bound, tail = log-rank test of the requests above the
# baseline's p90 bound (a heavier tail at the same median).
DEFAULT_TESTS = (("location", 0.6), ("p50", 0.015), ("p90", 0.02), ("p99", 0.04), ("tail", 0.3), ("spread", 0.025))
TEST_NAMES = ("location", "spread", "tail")
# Named target selectors a metric's matchers, error_matchers and query use as $name. The defaults are
# the fleet config's (prometheus/fleet.yaml, gpuobs.core.fleet): under kube-prometheus a
# ServiceMonitor's job is the Service name (e.g. vllm-engine-service, nvidia-dcgm-exporter), so a
# literal job="vllm" would select nothing on a real fleet and every look would HOLD on missing data.
DEFAULT_SELECTORS = {"vllm": DEFAULT_VLLM_SELECTOR, "dcgm": DEFAULT_DCGM_SELECTOR}
TOP_LEVEL_KEYS = ("alpha", "horizon", "interval", "step", "spending", "tail_spending", "pass_spending", "warmup",
                  "node_label", "node_spread", "node_spread_df", "node_history", "pre_stage", "node_drift", "node_drift_df",
                  "selectors", "metrics")
METRIC_KEYS = ("name", "title", "kind", "metric", "matchers", "error_matchers", "clustered_by", "query", "unit",
               "direction", "scale", "allowed_effect", "min_effect", "critical", "alpha_share", "min_samples",
               "tests", "quantile_allowed_effect")
_PLACEHOLDER = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
# PromQL string literals: "..." and '...' with backslash escapes, `...` raw (they are left alone)
_QUOTED = re.compile(r'''("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)''')


def parse_time(text: str, field_name: str) -> float:
    """Unix seconds or RFC 3339 (``2025-06-01T12:00:00Z``) -> unix seconds. Raises ConfigError."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value) or value < 0:
            raise ConfigError(field_name, text, "a finite, non-negative unix time or RFC 3339 time")
        return value
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(field_name, text, "unix seconds or RFC 3339 such as 2025-06-01T12:00:00Z") from None
    return (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp()


def parse_selector(text: str, field_name: str) -> str:
    """Validate PromQL label matchers (``track="canary"``, optionally in braces) -> matchers text.

    Raises :class:`ConfigError` unless it is one or more comma-separated ``name op "value"`` matchers.
    """
    s = (text or "").strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    if not s or not _SELECTOR.match(s):
        raise ConfigError(field_name, text, 'label matchers such as track="canary" or node=~"gpu-0[12]",job="vllm"')
    return s.rstrip(", ")


@dataclass(frozen=True)
class MetricSpec:
    """One analysed metric (fields as in the YAML; see its header)."""

    name: str
    kind: str
    direction: str
    allowed_effect: float
    critical: bool
    alpha_share: float
    min_samples: float
    title: str = ""
    unit: str = ""
    metric: str = ""
    matchers: str = ""
    error_matchers: str = ""
    clustered_by: str = ""
    query: str = ""
    scale: str = "relative"
    min_effect: float = 0.0
    tests: tuple[tuple[str, float], ...] = DEFAULT_TESTS
    quantile_allowed_effect: float = 0.25

    def test_alpha(self, metric_alpha: float) -> dict[str, float]:
        """Each histogram test's share of ``metric_alpha`` (weighted Bonferroni over the tests)."""
        total = sum(s for _, s in self.tests)
        return {name: metric_alpha * share / total for name, share in self.tests}

    def selector(self, user: str, extra: str = "") -> str:
        """The matcher list for this metric's own matchers, ``extra`` and the user's selector."""
        return ",".join(p for p in (self.matchers, extra, user) if p)


@dataclass(frozen=True)
class CanaryConfig:
    """The whole analysis configuration; ``metrics`` in report order."""

    alpha: float
    horizon_s: float
    interval_s: float
    step_s: float
    spending: Spending
    metrics: tuple[MetricSpec, ...] = field(default_factory=tuple)
    warmup_s: float = 0.0
    tail_spending: Spending | None = None  # quantile and spread tests; None -> spending
    pass_spending: Spending | None = None  # the passing end of every histogram test; None -> its harm spending
    node_label: str = "instance"
    node_spread: float = 0.015
    node_spread_df: float = 4.0
    node_history_s: float = 1800.0  # baseline nodes' spread also read over this much time before the look's window
    pre_stage_s: float = 7200.0  # the within-node design's pre-stage period: this much time before the stage
    node_drift: float = 0.005  # assumed sd of a node's own latency factor change from before the stage to during it
    node_drift_df: float = 4.0
    critical_share_total: float = 0.0  # sum of the critical alpha shares of the full config (select keeps it)

    def metric_alpha(self, spec: MetricSpec) -> float:
        """Per-metric error level: ``alpha * share / (sum of critical shares)`` (weighted Bonferroni).

        The sum is over the critical metrics of the *full* configuration, also after :meth:`select`
        (a selection never raises a metric's alpha). Advisory metrics get the same formula."""
        total = self.critical_share_total or sum(m.alpha_share for m in self.metrics if m.critical)
        if total <= 0:  # a selection of advisory metrics only: they are judged as critical (see select)
            total = sum(m.alpha_share for m in self.metrics)
        return self.alpha * spec.alpha_share / total

    def _copy(self, **kw: Any) -> "CanaryConfig":
        doc = {f: getattr(self, f) for f in ("alpha", "horizon_s", "interval_s", "step_s", "spending", "metrics",
                                              "warmup_s", "tail_spending", "pass_spending", "node_label",
                                              "node_spread", "node_spread_df", "node_history_s",
                                              "pre_stage_s", "node_drift", "node_drift_df",
                                              "critical_share_total")}
        doc.update(kw)
        return CanaryConfig(**doc)

    def with_timing(self, horizon_s: float | None = None, interval_s: float | None = None,
                    warmup_s: float | None = None) -> "CanaryConfig":
        """A copy with another horizon (stage length), look interval and/or warm-up, in seconds
        (horizon, interval > 0; 0 <= warm-up < horizon). Raises ConfigError naming the field."""
        for name, v in (("horizon", horizon_s), ("interval", interval_s)):
            if v is not None and not v > 0:
                raise ConfigError(name, v, "a positive number of seconds")
        horizon = horizon_s or self.horizon_s
        warmup = self.warmup_s if warmup_s is None else warmup_s
        if not 0 <= warmup < horizon:
            raise ConfigError("warmup", warmup, f"a duration >= 0 and shorter than the horizon ({horizon:g} s)")
        return self._copy(horizon_s=horizon, interval_s=interval_s or self.interval_s, warmup_s=float(warmup))

    def with_alpha(self, alpha: float) -> "CanaryConfig":
        """A copy with another family-wise alpha, 0 < alpha < 0.5 (e.g. a driver upgrade's stage alpha
        split between the GPU models it judges, Bonferroni). Raises ConfigError naming the field."""
        if not 0 < alpha < 0.5:
            raise ConfigError("alpha", alpha, "a number between 0 and 0.5")
        return self._copy(alpha=float(alpha))

    def with_node_history(self, seconds: float) -> "CanaryConfig":
        """A copy reading the baseline's node spread over ``seconds`` (>= 0; 0 = the look's window
        only) before each look's window. Raises ConfigError naming the field."""
        if not (math.isfinite(seconds) and 0 <= seconds <= 7 * 86400):
            raise ConfigError("node_history", seconds, "a duration of 0 to 7d")
        return self._copy(node_history_s=float(seconds))

    def select(self, names: list[str]) -> "CanaryConfig":
        """A copy restricted to ``names`` (alpha shares still relative to the full critical set).

        Selecting only advisory metrics (e.g. ``--metric e2e``) judges them as critical: the caller
        asked for a verdict on them, and a verdict with no critical metric could only be vacuous."""
        unknown = sorted(set(names) - {m.name for m in self.metrics})
        if unknown:
            raise ConfigError("--metric", ",".join(unknown), "one of " + ", ".join(m.name for m in self.metrics))
        chosen = tuple(m for m in self.metrics if m.name in names)
        total = self.critical_share_total or sum(m.alpha_share for m in self.metrics if m.critical)
        if not any(m.critical for m in chosen):
            chosen = tuple(dataclasses.replace(m, critical=True) for m in chosen)
            total = sum(m.alpha_share for m in chosen)
        return self._copy(metrics=chosen, critical_share_total=total)


def _num(doc: dict, key: str, where: str, lo: float, hi: float, default: Any = None) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise ConfigError(f"{where}.{key}", value, f"a number in [{lo}, {hi}]")
    return float(value)


def _outside_strings(text: str, fn: Any) -> str:
    """``text`` with ``fn`` applied to the parts outside PromQL string literals."""
    parts = _QUOTED.split(text)
    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))


def has_selector(query: str) -> bool:
    """Whether ``query`` uses ``$selector`` outside its string literals."""
    return any("$selector" in p for p in _QUOTED.split(query)[::2])


def fill_selector(query: str, selector: str) -> str:
    """``query`` with ``$selector`` outside string literals replaced by the ``selector`` matchers (a
    ``$selector`` inside a quoted value is the user's text, not a placeholder)."""
    return _outside_strings(query, lambda p: p.replace("$selector", selector))


def _substitute(text: str, selectors: dict[str, str], where: str, allowed: str) -> str:
    """``text`` with every ``$name`` outside PromQL string literals replaced by ``selectors[name]``;
    ``$selector`` (the --canary/--baseline matchers, filled in per query) is left as it is where
    ``allowed`` mentions it. Raises ConfigError naming ``where`` for a name that is not defined."""
    def repl(m: re.Match) -> str:
        name = m.group(1)
        if name == "selector" and "$selector" in allowed:
            return m.group(0)
        if name not in selectors:
            raise ConfigError(where, m.group(0), allowed + ", ".join(f"${k}" for k in sorted(selectors)))
        return selectors[name]
    return _outside_strings(text, lambda p: _PLACEHOLDER.sub(repl, p))


def _selectors(doc: Any, source: str, override: dict[str, str] | None) -> dict[str, str]:
    """The named selectors: :data:`DEFAULT_SELECTORS`, updated by the config's ``selectors`` mapping,
    then by ``override`` (e.g. ``--fleet``). Raises ConfigError naming the bad entry."""
    out = dict(DEFAULT_SELECTORS)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}.selectors", doc, 'a mapping of names to label matchers, e.g. {vllm: \'job="vllm"\'}')
    for key, value in [*doc.items(), *(override or {}).items()]:
        if not isinstance(key, str) or not _LABEL_NAME.match(key) or key == "selector":
            raise ConfigError(f"{source}.selectors", key, "a name of letters, digits and _ (not 'selector')")
        if not isinstance(value, str):
            raise ConfigError(f"{source}.selectors.{key}", value, 'label matchers such as job=~"vllm|.*vllm.*"')
        out[key] = parse_selector(value, f"{source}.selectors.{key}")
    return out


def _metric(doc: Any, i: int, selectors: dict[str, str] | None = None) -> MetricSpec:
    where = f"metrics[{i}]"
    if not isinstance(doc, dict):
        raise ConfigError(where, doc, "a mapping")
    name = doc.get("name")
    if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9_.-]+$", name):
        raise ConfigError(f"{where}.name", name, "a name of letters, digits, _ . -")
    where = f"metrics.{name}"
    unknown = sorted(str(k) for k in set(doc) - set(METRIC_KEYS))
    if unknown:
        raise ConfigError(where, ", ".join(unknown), "keys among " + ", ".join(METRIC_KEYS))
    kind, direction, scale = doc.get("kind"), doc.get("direction", "increase"), doc.get("scale", "relative")
    if kind not in KINDS:
        raise ConfigError(f"{where}.kind", kind, " | ".join(KINDS))
    if direction not in DIRECTIONS:
        raise ConfigError(f"{where}.direction", direction, " | ".join(DIRECTIONS))
    if scale not in SCALES:
        raise ConfigError(f"{where}.scale", scale, " | ".join(SCALES))
    if kind == "errors" and direction != "increase":
        raise ConfigError(f"{where}.direction", direction, "increase (errors are harmful when they rise)")
    text = {k: doc.get(k, "") for k in ("metric", "matchers", "error_matchers", "clustered_by", "query",
                                         "title", "unit")}
    for k, v in text.items():
        if not isinstance(v, str):
            raise ConfigError(f"{where}.{k}", v, "a string")
    named = selectors if selectors is not None else DEFAULT_SELECTORS
    text["query"] = _substitute(text["query"], named, f"{where}.query", "$selector or one of the selectors: ")
    for k in ("matchers", "error_matchers"):
        text[k] = _substitute(text[k], named, f"{where}.{k}", "one of the selectors: ")
    for k in ("metric", "clustered_by"):
        if text[k] and not _METRIC_NAME.match(text[k]):
            raise ConfigError(f"{where}.{k}", text[k], "a Prometheus metric name")
    for k in ("matchers", "error_matchers"):
        if text[k]:  # stored normalised: no braces, no trailing comma (the query joins them with ",")
            text[k] = parse_selector(text[k], f"{where}.{k}")
    if kind in ("histogram", "errors") and not text["metric"]:
        raise ConfigError(f"{where}.metric", None, "the metric name (without _bucket)")
    if kind == "errors" and not text["error_matchers"]:
        raise ConfigError(f"{where}.error_matchers", None, 'matchers selecting errors, e.g. finished_reason="error"')
    if kind == "series" and not has_selector(text["query"]):
        raise ConfigError(f"{where}.query", text["query"] or None, "a PromQL query using $selector outside its quoted strings")
    critical = doc.get("critical", False)
    if not isinstance(critical, bool):
        raise ConfigError(f"{where}.critical", critical, "true or false")
    hi_effect = 1.0 if scale == "absolute" or kind == "errors" else 10.0
    extra: dict[str, Any] = {}
    if kind == "histogram":
        extra["tests"] = _tests(doc.get("tests"), f"{where}.tests")
        extra["quantile_allowed_effect"] = _num(doc, "quantile_allowed_effect", where, 1e-6, 10.0, 0.25)
    elif "tests" in doc:
        raise ConfigError(f"{where}.tests", doc["tests"], "only for kind: histogram")
    return MetricSpec(
        name=name, kind=kind, direction=direction, scale="absolute" if kind == "errors" else scale,
        allowed_effect=_num(doc, "allowed_effect", where, 1e-6, hi_effect),
        min_effect=_num(doc, "min_effect", where, 0.0, hi_effect, 0.0),
        critical=critical, alpha_share=_num(doc, "alpha_share", where, 1e-6, 1e6, 1.0),
        min_samples=_num(doc, "min_samples", where, 3, 1e12, 100), **extra, **text)


def _tests(doc: Any, where: str) -> tuple[tuple[str, float], ...]:
    """``{location: share, spread: share, p99: share, ...}`` -> ordered (name, share) pairs."""
    if doc is None:
        return DEFAULT_TESTS
    accepted = ("a mapping of location, spread, tail and pNN (0 < NN < 100) to alpha shares > 0, "
                "e.g. {location: 0.4, tail: 0.3, p99: 0.1}")
    if not isinstance(doc, dict) or not doc:
        raise ConfigError(where, doc, accepted)
    out = []
    for name, share in doc.items():
        m = _QUANTILE_TEST.match(str(name))
        if not (name in TEST_NAMES or (m and 0 < float(m.group(1)) < 100)):
            raise ConfigError(f"{where}.{name}", name, accepted)
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not share > 0:
            raise ConfigError(f"{where}.{name}", share, "an alpha share > 0")
        out.append((str(name), float(share)))
    return tuple(out)


def quantile_of(test: str) -> float:
    """``"p99"`` -> 0.99, ``"p99.9"`` -> 0.999."""
    return float(test[1:]) / 100.0


def _spending(doc: dict, key: str, source: str, alpha: float, defaults: tuple[float, float, float]) -> Spending:
    """The spending function under ``doc[key]`` (a mapping main_until, main_share, rho; absent -> the
    ``defaults`` in that order) at ``alpha``. Raises ConfigError naming the field."""
    sp = doc.get(key) or {}
    if not isinstance(sp, dict):
        raise ConfigError(f"{source}.{key}", sp, "a mapping main_until, main_share, rho")
    until, share, rho = defaults
    return Spending(alpha, _num(sp, "main_until", key, 0.01, 1.0, until), _num(sp, "main_share", key, 0.0, 1.0, share),
                    _num(sp, "rho", key, 0.1, 10, rho))


def _lookback(doc: dict, key: str, default: str, source: str, zero_means: str) -> float:
    """A look-back duration ``doc[key]`` in seconds, 0 to 7 days (0: ``zero_means``). Raises ConfigError
    naming the field."""
    value = doc.get(key, default)
    try:
        seconds = parse_duration(value, key, allow_zero=True)
    except DurationError:
        raise ConfigError(f"{source}.{key}", value, f"a duration >= 0 such as 30m, 2h (0 = {zero_means})") from None
    if seconds > 7 * 86400:
        raise ConfigError(f"{source}.{key}", value, f"a duration of at most 7d (0 = {zero_means})")
    return seconds


def parse_config(doc: Any, source: str = "config", selectors: dict[str, str] | None = None) -> CanaryConfig:
    """Validate a loaded YAML document. ``selectors`` overrides the document's named selectors (the
    ``$vllm``/``$dcgm`` its metrics use). Raises :class:`ConfigError` (field named) on any bad value."""
    if not isinstance(doc, dict):
        raise ConfigError(source, type(doc).__name__, "a mapping with alpha, horizon, interval, metrics")
    unknown = sorted(str(k) for k in set(doc) - set(TOP_LEVEL_KEYS))
    if unknown:  # a typo (selector: for selectors:) must not fall back to defaults silently
        raise ConfigError(f"{source}", ", ".join(unknown), "top-level keys among " + ", ".join(TOP_LEVEL_KEYS))
    alpha = _num(doc, "alpha", source, 1e-6, 0.2, 0.01)
    spending = _spending(doc, "spending", source, alpha, (0.5, 0.85, 3.0))
    tail_spending = _spending(doc, "tail_spending", source, alpha, (1.0, 1.0, 5.0))
    pass_spending = _spending(doc, "pass_spending", source, alpha, (1.0, 1.0, 1.0))
    metrics = doc.get("metrics")
    if not isinstance(metrics, list) or not metrics:
        raise ConfigError(f"{source}.metrics", metrics, "a non-empty list")
    named = _selectors(doc.get("selectors"), source, selectors)
    specs = tuple(_metric(m, i, named) for i, m in enumerate(metrics))
    names = [m.name for m in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}.metrics", names, "unique metric names")
    if not any(m.critical for m in specs):
        raise ConfigError(f"{source}.metrics", "no critical metric", "at least one metric with critical: true")
    node_label = doc.get("node_label", "instance")
    if not isinstance(node_label, str) or not _LABEL_NAME.match(node_label) or node_label == "le":
        raise ConfigError(f"{source}.node_label", node_label,
                          "a Prometheus label name (not le), e.g. instance, pod, node")
    horizon = parse_duration(doc.get("horizon", "10m"), "horizon")
    warmup = doc.get("warmup", 0)
    warmup_s = parse_duration(warmup, "warmup", allow_zero=True)
    if warmup_s >= horizon:
        raise ConfigError(f"{source}.warmup", warmup, f"a duration shorter than the horizon ({horizon:g} s)")
    node_history_s = _lookback(doc, "node_history", "30m", source, "the look's window only")
    pre_stage_s = _lookback(doc, "pre_stage", "2h", source, "compare between nodes only")
    return CanaryConfig(alpha, horizon, parse_duration(doc.get("interval", "30s"), "interval"),
                        parse_duration(doc.get("step", "15s"), "step"), spending, specs, warmup_s=warmup_s,
                        tail_spending=tail_spending, pass_spending=pass_spending,
                        node_label=node_label, node_spread=_num(doc, "node_spread", source, 0.0, 1.0, 0.015),
                        node_spread_df=_num(doc, "node_spread_df", source, 0.0, 1e6, 4.0),
                        node_history_s=node_history_s, pre_stage_s=pre_stage_s, node_drift=_num(doc, "node_drift", source, 0.0, 1.0, 0.005),
                        node_drift_df=_num(doc, "node_drift_df", source, 0.0, 1e6, 4.0))


def load_config(path: str | Path | None = None, selectors: dict[str, str] | None = None) -> CanaryConfig:
    """Load ``path`` (YAML), or the packaged default when None; ``selectors`` overrides its named
    selectors (see :func:`parse_config`). Raises :class:`ConfigError`."""
    if path is None:
        text = resources.files("gpuobs.canary").joinpath("data/metrics.yaml").read_text()
        source = "metrics.yaml"
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError("--config", str(path), f"a readable YAML file ({exc.strerror})") from None
        source = str(path)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, "YAML", f"valid YAML ({yaml_problem(exc)})") from None
    return parse_config(doc, source, selectors)
