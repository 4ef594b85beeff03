"""Canary verdicts: the per-metric result, the combination rule, text and JSON forms.

Combination (:func:`decide`, vectorised so the benchmark applies the same rule):

* ROLLBACK when any critical metric is harmful (High for ``direction: increase``, Low for
  ``decrease``, either for ``either``) at its share of the family-wise alpha;
* PROMOTE when every critical metric has data and is Pass, or significantly better;
* HOLD otherwise: NoData (too few samples, empty result, NaN) or Inconclusive on a critical metric,
  so missing data can delay a promotion but never cause one, and never cause a rollback either.

Non-critical metrics are advisory: reported (and listed as warnings when harmful) but never decide.
Verdict codes equal the CLI exit codes (:mod:`gpuobs.core.errors`): PROMOTE 0, ROLLBACK 1, HOLD 3.

Said once: a ROLLBACK's reasons are one short line per deciding test (:func:`deciding_tests`,
:func:`deciding_line`: ``ttft: High (+29.8% [+0.6%, +67.3%])``); the assumptions a look rests on
(the node-spread prior, :mod:`gpuobs.canary.histstats`) are :attr:`Verdict.assumptions`, one entry per
distinct assumption, never repeated in the reasons or per metric.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gpuobs.canary.stats import CLASS_NAMES, HIGH, LOW, NODATA, PASS  # noqa: F401

PROMOTE, ROLLBACK, HOLD = 0, 1, 3
VERDICT_NAMES = {PROMOTE: "PROMOTE", ROLLBACK: "ROLLBACK", HOLD: "HOLD"}


def decide(codes: np.ndarray, harm: np.ndarray, critical: np.ndarray) -> np.ndarray:
    """Verdict codes from classification ``codes`` and ``harm`` flags ``(..., M)`` and ``critical`` ``(M,)``."""
    codes = np.asarray(codes)
    harm = np.asarray(harm, dtype=bool)
    crit = np.asarray(critical, dtype=bool)
    rollback = (harm & crit).any(-1)
    ok = np.isin(codes, (PASS, HIGH, LOW)) & ~harm
    # no evidence, no verdict: PROMOTE needs at least one critical metric and data on every one
    promote = (ok | ~crit).all(-1) & crit.any() & ~((codes == NODATA) & crit).any(-1)
    return np.where(rollback, ROLLBACK, np.where(promote, PROMOTE, HOLD))


def rollout_false_rollback_bound(alpha: float, stages: int) -> float:
    """Chance that a healthy release is rolled back somewhere in a rollout of ``stages`` stages, each
    analysed at family-wise ``alpha``: at most ``1 - (1 - alpha)**stages`` when the stages' data are
    independent, and never more than ``stages * alpha`` (Bonferroni) whatever their dependence.
    Raises ValueError unless 0 <= alpha <= 1 and stages >= 1."""
    if not 0 <= alpha <= 1 or stages < 1:
        raise ValueError(f"alpha must be in [0, 1] and stages >= 1, got {alpha}, {stages}")
    return min(1.0, stages * alpha)


@dataclass
class MetricResult:
    """One metric's row. ``effect``/``interval`` are relative (``scale == "relative"``: +0.1 = +10%)
    or absolute differences; ``interval`` is the repeated/anytime confidence interval at the metric's
    alpha per side. ``baseline``/``canary`` hold descriptive values (quantiles in ``unit``, ratios).
    ``evidence``: the statistic and its boundary (``z`` vs ``boundary``, or ``log_e`` vs ``threshold``).
    ``data_start``: unix time the counter metrics' ``increase()`` was read from (the look's start, or
    later when the series began inside the window; :mod:`gpuobs.canary.analyzer`); None for series metrics.
    ``assumption``: the assumption this metric's intervals rest on (the node-spread prior when it
    carries weight), metric-independent words so the verdict can say it once; ``""`` when none.
    ``design``: how a histogram metric's nodes were compared: ``"within-node"`` (each canary node against
    its own pre-stage period) or ``"between-node"`` (against the baseline's nodes);
    ``""`` for other kinds (docs/canary.md, 1f); ``design_note`` says why (which nodes had pre-stage
    data, or why none could be used).
    """

    name: str
    title: str
    kind: str
    unit: str
    scale: str
    direction: str
    critical: bool
    alpha: float
    classification: str = "NoData"
    harmful: bool = False
    effect: float | None = None
    interval: tuple[float, float] | None = None
    baseline: dict[str, float] = field(default_factory=dict)
    canary: dict[str, float] = field(default_factory=dict)
    evidence: dict[str, float] = field(default_factory=dict)
    n_canary: float = 0.0
    n_baseline: float = 0.0
    reason: str = ""
    look: dict[str, float] | None = None
    tests: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    needed_canary: float | None = None
    data_start: float | None = None
    assumption: str = ""
    design: str = ""
    design_note: str = ""

    @property
    def code(self) -> int:
        """Numeric classification (:data:`gpuobs.canary.stats.CLASS_NAMES` index)."""
        return CLASS_NAMES.index(self.classification)


@dataclass
class Verdict:
    """The analysis of one look: verdict, reasons, per-metric results and the look's position.

    ``reasons``: short lines (a ROLLBACK's: one per deciding test, :func:`deciding_line`).
    ``deciding``: a ROLLBACK's deciding tests as :func:`deciding_tests` gives them (empty otherwise).
    ``assumptions``: each distinct assumption of the critical metrics once, as
    ``"<metric>[, <metric>...]: <assumption>"`` (:func:`assumptions`)."""

    verdict: str
    reasons: list[str]
    warnings: list[str]
    metrics: list[MetricResult]
    canary: str
    baseline: str
    start: float
    end: float
    time_fraction: float
    final: bool
    alpha: float
    promote_reachable: bool = True
    warmup_s: float = 0.0
    deciding: list[dict[str, Any]] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    design: str = ""

    @property
    def exit_code(self) -> int:
        """0 PROMOTE, 1 ROLLBACK, 3 HOLD (:mod:`gpuobs.core.errors`)."""
        return {v: k for k, v in VERDICT_NAMES.items()}[self.verdict]

    @property
    def score(self) -> float:
        """Kayenta-style 0-100: share of metrics with data that are not harmful (informational only)."""
        judged = [m for m in self.metrics if m.classification != "NoData"]
        return 100.0 * sum(not m.harmful for m in judged) / len(judged) if judged else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (non-finite floats become None, intervals become two-element lists)."""
        doc = asdict(self)
        doc["score"] = round(self.score, 1)
        doc["exit_code"] = self.exit_code
        return _clean(doc)

    def table(self, assumptions: bool = True) -> str:
        """Text report: a header, one row per metric, then reasons, warnings, the assumptions (each
        once; ``assumptions=False`` leaves them to a caller that prints them in its own header, e.g.
        a rollout's report across its looks) and notes."""
        head = (f"Canary verdict: {self.verdict}  (window {self.end - self.start:.0f} s = {self.time_fraction:.0%} "
                f"of the horizon{', final' if self.final else ''}; family-wise alpha {self.alpha:g})\n"
                f"canary: {self.canary}   baseline: {self.baseline}"
                + (f"\ndesign: {self.design}" if self.design else ""))
        cols = ("metric", "class", "baseline", "canary", "effect", "interval", "evidence", "crit")
        rows = [cols]
        for m in self.metrics:
            rows.append(_row(m))
            rows += [_test_row(m, t) for t in m.tests]
        widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
        lines = [head] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines += [f"reason: {r}" for r in self.reasons] + [f"warning: {w}" for w in self.warnings]
        lines += [f"assumption: {a}" for a in self.assumptions] if assumptions else []
        lines += [f"note: {m.name}: {n}" for m in self.metrics for n in m.notes]
        lines.append(f"note: alpha {self.alpha:g} is per stage; a rollout of k stages rolls back a healthy release "
                     f"with probability at most k x {self.alpha:g} "
                     f"(e.g. {rollout_false_rollback_bound(self.alpha, 4):.0%}"
                     f" for 4 stages)")
        return "\n".join(lines)


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def fmt_effect(value: float | None, scale: str) -> str:
    """``+12.3%`` for relative effects, ``+0.0123`` for absolute ones, ``-`` when unknown."""
    if value is None or not math.isfinite(value):
        return "-" if value is None or math.isnan(value) else ("+inf" if value > 0 else "-inf")
    if scale == "relative" and value > 100:  # an interval end beyond any useful resolution
        return ">+10000%"
    return f"{value * 100:+.1f}%" if scale == "relative" else f"{value:+.4f}"


def _values(m: MetricResult, side: dict[str, float]) -> str:
    if not side:
        return "-"
    if m.kind == "histogram":
        return f"{side.get('p50', math.nan):.3g}/{side.get('p99', math.nan):.3g} {m.unit}".strip()
    if m.kind == "errors":
        return f"{side.get('ratio', math.nan) * 100:.3f}%"
    return f"{side.get('mean', math.nan):.4g} {m.unit}".strip()


def _row(m: MetricResult) -> tuple[str, ...]:
    scale = "relative" if m.kind == "errors" else m.scale
    interval = "-" if m.interval is None else f"[{fmt_effect(m.interval[0], scale)}, {fmt_effect(m.interval[1], scale)}]"
    ev = m.evidence
    if "z" in ev:
        evidence = f"z={ev['z']:+.2f} (bound {ev['boundary']:.2f})"
    elif "log_e" in ev:
        evidence = f"e={math.exp(min(ev['log_e'], 700)):.3g} (bound {math.exp(ev['threshold']):.3g})"
    else:
        evidence = m.reason or "-"
    cls = m.classification + ("!" if m.harmful else "")
    return (m.name, cls, _values(m, m.baseline), _values(m, m.canary), fmt_effect(m.effect, scale), interval,
            evidence, "yes" if m.critical else "no")


def _test_row(m: MetricResult, t: dict[str, Any]) -> tuple[str, ...]:
    cls = t["classification"] + ("!" if t.get("harmful") else "")
    if cls in ("NoData", "n/a"):
        return (f"  .{t['test']}", cls, "", "", "-", "-", t.get("reason", "-"), "")
    iv = f"[{fmt_effect(t['interval'][0], 'relative')}, {fmt_effect(t['interval'][1], 'relative')}]"
    node = f", node sd {t['node_tau']:.3f} ({t['node_tau_source']})" if t.get("node_tau") else ""
    ev = f"z={t['z']:+.2f} (bound {t['boundary']:.2f}{node})"
    where = f"> {t['threshold']:g} {m.unit}: {t['share_baseline']:.2%}" if "threshold" in t else ""
    canary = f"{t['share_canary']:.2%}" if "threshold" in t else ""
    return (f"  .{t['test']}", cls, where, canary, fmt_effect(t["effect"], "relative"), iv, ev, "")


def describe(m: MetricResult) -> str:
    """One-line summary of a metric result for reasons and logs."""
    scale = "relative" if m.kind == "errors" else m.scale
    if m.classification == "NoData":
        return f"{m.name}: NoData ({m.reason})"
    iv = "" if m.interval is None else f" [{fmt_effect(m.interval[0], scale)}, {fmt_effect(m.interval[1], scale)}]"
    harm = [t for t in m.tests if t.get("harmful")]
    if harm:  # the metric's (location) effect first, then each harmful test with its interval
        return f"{m.name}: {m.classification} ({fmt_effect(m.effect, scale)}{iv}; harmful: " + "; ".join(
            f"{t['test']} {fmt_effect(t['effect'], 'relative')} [{fmt_effect(t['interval'][0], 'relative')}, "
            f"{fmt_effect(t['interval'][1], 'relative')}]" for t in harm) + ")"
    design = f", {m.design}" if m.design else ""
    return f"{m.name}: {m.classification} ({fmt_effect(m.effect, scale)}{iv}{design})"


def deciding_tests(metrics: list[MetricResult]) -> list[dict[str, Any]]:
    """The tests that make a look ROLLBACK: each harmful test of each harmful critical metric
    (histograms), or the metric itself (errors, series). One dict each: ``metric``, ``test`` (None for
    a metric without tests), ``classification``, ``effect`` and ``interval`` ``[lo, hi]`` (on ``scale``:
    ``relative`` = ratio - 1, +0.1 = +10%; ``absolute`` in the metric's unit), ``scale``."""
    out = []
    for m in metrics:
        if not (m.critical and m.harmful):
            continue
        harm = [t for t in m.tests if t.get("harmful")]
        if harm:
            out += [{"metric": m.name, "test": t["test"], "classification": t["classification"],
                     "effect": t["effect"], "interval": list(t["interval"]), "scale": "relative",
                     "design": m.design} for t in harm]
        else:
            out.append({"metric": m.name, "test": None, "classification": m.classification, "effect": m.effect,
                        "interval": None if m.interval is None else list(m.interval),
                        "scale": "relative" if m.kind == "errors" else m.scale})
    return out


def deciding_line(d: dict[str, Any]) -> str:
    """One deciding test (:func:`deciding_tests`, or its JSON form) in one short line:
    ``ttft: High (+29.8% [+0.6%, +67.3%])``; a test other than the location test is named
    (``ttft p99: High (...)``)."""
    name = d["metric"] + (f" {d['test']}" if d.get("test") not in (None, "location") else "")
    iv = d.get("interval")
    span = "" if not iv else f" [{fmt_effect(iv[0], d['scale'])}, {fmt_effect(iv[1], d['scale'])}]"
    design = f", {d['design']}" if d.get("design") else ""
    return f"{name}: {d['classification']} ({fmt_effect(d.get('effect'), d['scale'])}{span}{design})"


def design_of(metrics: list[MetricResult]) -> str:
    """The look's comparison design from its critical histogram metrics: ``"within-node"``,
    ``"between-node"``, ``"mixed (ttft within-node, itl between-node)"``, or ``""`` without one."""
    used = [(m.name, m.design) for m in metrics if m.critical and m.design]
    kinds = {d for _, d in used}
    if len(kinds) <= 1:
        return next(iter(kinds), "")
    return "mixed (" + ", ".join(f"{n} {d}" for n, d in used) + ")"


def design_line(metrics: list[MetricResult]) -> str:
    """The design and why, once per look: ``within-node (1 of 1 canary and 19 of 19 baseline node(s)
    compared with their own pre-stage period)``; the first critical histogram metric's note."""
    design = design_of(metrics)
    note = next((m.design_note for m in metrics if m.critical and m.design and m.design_note), "")
    return f"{design} ({note})" if design and note and not design.startswith("mixed") else design


def assumptions(metrics: list[MetricResult]) -> list[str]:
    """Each distinct :attr:`MetricResult.assumption` of the critical metrics once, prefixed with the
    metrics it applies to: ``["ttft, itl: node-to-node variation from ..."]``, in metric order."""
    seen: dict[str, list[str]] = {}
    for m in metrics:
        if m.critical and m.assumption:
            seen.setdefault(m.assumption, []).append(m.name)
    return [f"{', '.join(names)}: {text}" for text, names in seen.items()]


def combine(metrics: list[MetricResult]) -> tuple[str, list[str], list[str]]:
    """Apply :func:`decide` to metric results; returns (verdict name, reasons, warnings). A
    ROLLBACK's reasons are :func:`deciding_line` of each :func:`deciding_tests` entry."""
    codes = np.array([m.code for m in metrics])
    harm = np.array([m.harmful for m in metrics])
    crit = np.array([m.critical for m in metrics])
    verdict = VERDICT_NAMES[int(decide(codes, harm, crit))]
    critical = [m for m in metrics if m.critical]
    if verdict == "PROMOTE" and any(m.classification == "NoData" for m in critical):  # decide() forbids it
        raise AssertionError("PROMOTE with a critical metric lacking data")
    if verdict == "ROLLBACK":
        reasons = [deciding_line(d) for d in deciding_tests(metrics)]
    elif verdict == "PROMOTE":
        design = design_of(metrics)
        reasons = ["every critical metric is within its allowed effect: "
                   + ", ".join(m.name for m in critical) + (f" ({design})" if design else "")]
    else:
        reasons = [describe(m) for m in critical if m.code not in (PASS, HIGH, LOW) or m.harmful]
    warnings = [describe(m) + " (advisory metric)" for m in metrics if not m.critical and m.harmful]
    warnings += [describe(m) + " (advisory metric)" for m in metrics if not m.critical and m.code == NODATA]
    return verdict, reasons, warnings
