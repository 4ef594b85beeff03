"""Generate the SLO rule file (SLIs, burn rates, error budget, burn-rate alerts) from ``prometheus/slo.yaml``.

Method: Google SRE Workbook, chapter "Alerting on SLOs", multiwindow multi-burn-rate alerts. For an
SLO period P, each alert spends a fraction of the error budget within a long window; the burn factor
is that fraction divided by the window's share of the period, and the short window is 1/12 of the
long one (the Workbook's 5m for 1h):

=========  ==============  ==================  ============  =======
severity   budget spent    long window          short window  factor
=========  ==============  ==================  ============  =======
critical   2 %             P / 720 (1h @ 30d)   long / 12     14.4
critical   5 %             P / 120 (6h @ 30d)   long / 12     6
warning    10 %            P / 10  (3d @ 30d)   long / 12     1
=========  ==============  ==================  ============  =======

Recording-rule names follow ``level:metric:operations`` (Prometheus naming practices), with the
``slo:sli_error:ratio_rate<window>`` shape Sloth uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuobs.core.durations import DurationError, format_duration, parse_duration
from gpuobs.core.errors import InputError
from gpuobs.core.fleet import FleetConfig
from gpuobs.mixin.runbooks import runbook_url
from gpuobs.reference.buckets import ITL_BUCKETS, TTFT_BUCKETS

#: (severity, fraction of the error budget spent, long window as a fraction of the period).
BURN_POLICY = [("critical", 0.02, 1 / 720), ("critical", 0.05, 1 / 120), ("warning", 0.10, 1 / 10)]
SHORT_WINDOW_DIVISOR = 12


class SloConfigError(InputError):
    """prometheus/slo.yaml is malformed; the message names the field and the allowed values."""


#: SLO periods the generator accepts: from 12h (the shortest window, period/720 = 1m, still spans
#: several scrapes) to 366d.
MIN_PERIOD_S, MAX_PERIOD_S = 12 * 3600, 366 * 86400


def parse_period(text: str) -> int:
    """An SLO period in seconds, within [12h, 366d]. Raises SloConfigError naming the bounds."""
    try:
        secs = parse_duration(text, "period")
    except DurationError as exc:
        raise SloConfigError(f"period: expected a duration like 30d, 7d, 3d or 12h; got {text!r}") from exc
    if secs != int(secs):
        raise SloConfigError(f"period: must be whole seconds; got {text!r}")
    secs = int(secs)
    if not MIN_PERIOD_S <= secs <= MAX_PERIOD_S:
        raise SloConfigError(f"period: must be between 12h and 366d; got {text!r}")
    return secs


@dataclass(frozen=True)
class Window:
    """One burn-rate alert condition: severity, long/short windows (seconds), burn factor."""

    severity: str
    long_s: int
    short_s: int
    factor: float


def windows(period_s: int) -> list[Window]:
    """The burn-rate windows for an SLO period (seconds), per :data:`BURN_POLICY`."""
    out = []
    for severity, budget, share in BURN_POLICY:
        long_s = round(period_s * share)
        short_s = max(30, round(long_s / SHORT_WINDOW_DIVISOR))
        out.append(Window(severity, long_s, short_s, round(budget / share, 4)))
    return out


def load_config(path: Path) -> dict:
    """Read and validate slo.yaml; raises SloConfigError naming the bad field."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SloConfigError(f"{path}: cannot read it as YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("slos"), list) or not doc["slos"]:
        raise SloConfigError("slos: expected a non-empty list")
    parse_period(doc.get("period"))
    names = set()
    for slo in doc["slos"]:
        name = slo.get("name")
        if name not in ("ttft", "availability"):
            raise SloConfigError(f"slos[].name: expected ttft or availability; got {name!r}")
        if name in names:
            raise SloConfigError(f"slos[].name: {name} given twice")
        names.add(name)
        obj = slo.get("objective")
        if not isinstance(obj, float) or not 0.5 < obj < 1:
            raise SloConfigError(f"slos[{name}].objective: expected a ratio like 0.999; got {obj!r}")
        if name == "ttft" and slo.get("ttft_threshold_seconds") not in TTFT_BUCKETS:
            raise SloConfigError(f"slos[ttft].ttft_threshold_seconds must be a vLLM TTFT bucket boundary "
                                 f"({', '.join(map(str, TTFT_BUCKETS))}); got {slo.get('ttft_threshold_seconds')!r}")
    if doc.get("goodput_tpot_threshold_seconds") not in ITL_BUCKETS:
        raise SloConfigError("goodput_tpot_threshold_seconds must be a vLLM TPOT bucket boundary "
                             f"({', '.join(map(str, ITL_BUCKETS))})")
    return doc


def _le(value: float) -> str:
    return repr(float(value))


def _sli(slo: dict, w: str) -> str:
    if slo["name"] == "ttft":
        le = _le(slo["ttft_threshold_seconds"])
        return (f'1 - (sum by (model_name) (rate(vllm:time_to_first_token_seconds_bucket{{le="{le}"}}[{w}]))'
                f' / sum by (model_name) (rate(vllm:time_to_first_token_seconds_count[{w}])))')
    return (f'sum by (model_name) (rate(vllm:request_success_total{{finished_reason="error"}}[{w}]))'
            f' / sum by (model_name) (rate(vllm:request_success_total[{w}]))')


def _requests(slo: dict, w: str) -> str:
    """Requests per second the SLI counted over ``w`` (its denominator)."""
    metric = "vllm:time_to_first_token_seconds_count" if slo["name"] == "ttft" else "vllm:request_success_total"
    return f"sum by (model_name) (rate({metric}[{w}]))"


#: A burn-rate condition also needs enough requests in its long window that, at the threshold, at
#: least this many bad requests are expected: a young stack or a quiet model must not page on one
#: unlucky request (1 error in 700 requests is "14.4x" a 0.1 % budget, but it is not evidence).
MIN_BAD_EVENTS = 10


def min_requests(factor: float, budget: float) -> int:
    """Requests the long window must hold: MIN_BAD_EVENTS / (factor * budget), rounded up."""
    return math.ceil(MIN_BAD_EVENTS / (factor * budget) - 1e-9)


def slo_rules(cfg: dict, fleet: FleetConfig, period: str | None = None, for_override: str | None = None) -> dict:
    """The rule groups for ``cfg`` (from :func:`load_config`); ``fleet``: the fleet config (its runbook and
    dashboard bases, :class:`gpuobs.core.fleet.FleetConfig`); ``period`` overrides cfg's period."""
    period_text = period or cfg["period"]
    period_s = parse_period(period_text)
    wins = windows(period_s)
    needed = sorted({w.long_s for w in wins} | {w.short_s for w in wins} | {300})
    recording, alerts = [], []
    for slo in cfg["slos"]:
        name, budget = slo["name"], round(1 - slo["objective"], 6)
        labels = {"slo": name}
        for s in needed:
            w = format_duration(s)
            recording.append({"record": f"slo:sli_error:ratio_rate{w}", "expr": _sli(slo, w), "labels": labels})
        for sec in sorted({w.long_s for w in wins}):
            w = format_duration(sec)
            recording.append({"record": f"slo:sli_requests:rate{w}", "expr": _requests(slo, w), "labels": labels})
        recording.append({"record": "slo:objective:ratio", "expr": f"vector({slo['objective']})", "labels": labels})
        for sec in needed:
            w = format_duration(sec)
            recording.append({"record": f"slo:burn_rate:ratio_rate{w}",
                              "expr": f'slo:sli_error:ratio_rate{w}{{slo="{name}"}} / {budget}', "labels": labels})
        for severity in ("critical", "warning"):
            conds = [f'(slo:sli_error:ratio_rate{format_duration(w.long_s)}{{slo="{name}"}} > ({w.factor} * {budget})'
                     f' and slo:sli_error:ratio_rate{format_duration(w.short_s)}{{slo="{name}"}} > ({w.factor} * {budget})'
                     f' and slo:sli_requests:rate{format_duration(w.long_s)}{{slo="{name}"}} * {w.long_s}'
                     f' >= {min_requests(w.factor, budget)})'
                     for w in wins if w.severity == severity]
            spec = ", ".join(f"{format_duration(w.long_s)}/{format_duration(w.short_s)} at {w.factor}x"
                             for w in wins if w.severity == severity)
            alert = {
                "alert": "ServingErrorBudgetBurn",
                "expr": " or ".join(conds),
                "labels": {"severity": severity, "family": "slo", "slo": name},
                "annotations": {
                    "summary": f"The {name} SLO's error budget is burning too fast "
                               f"({'page' if severity == 'critical' else 'ticket'}: {spec}).",
                    "description": (f"Model {{{{ $labels.model_name }}}}: {name} SLI error ratio is {{{{ $value | humanizePercentage }}}} "
                                    f"against a budget of {budget * 100:g}% ({slo['description']}) "
                                    f"Windows and factors derive from the {period_text} SLO period; each window "
                                    f"needs enough requests for {MIN_BAD_EVENTS} bad ones at the threshold."),
                    "runbook_url": runbook_url(fleet.runbook_base, "slo", "ServingErrorBudgetBurn"),
                    "dashboard_url": f"{fleet.dashboard_base}/d/gpuobs-serving/serving-slos?viewPanel=7",
                },
            }
            if for_override:
                alert["for"] = for_override
            alerts.append(alert)
    period_w = format_duration(period_s)
    budget_rules = []
    for slo in cfg["slos"]:
        budget = round(1 - slo["objective"], 6)
        budget_rules.append({"record": f"slo:sli_error:ratio_rate{period_w}", "expr": _sli(slo, period_w),
                             "labels": {"slo": slo["name"]}})
        budget_rules.append({"record": "slo:error_budget_remaining:ratio",
                             "expr": f'1 - slo:sli_error:ratio_rate{period_w}{{slo="{slo["name"]}"}} / {budget}',
                             "labels": {"slo": slo["name"]}})
    ttft = next((s for s in cfg["slos"] if s["name"] == "ttft"), None)
    if ttft:
        le, tpot = _le(ttft["ttft_threshold_seconds"]), _le(cfg["goodput_tpot_threshold_seconds"])
        # Goodput: TTFT-good requests/s times the share of requests whose mean TPOT meets its threshold.
        # Histograms do not join per request, so this assumes the two are independent (documented).
        recording.append({"record": "model_name:vllm_goodput_requests:rate5m", "expr":
                          f'sum by (model_name) (rate(vllm:time_to_first_token_seconds_bucket{{le="{le}"}}[5m]))'
                          f' * (sum by (model_name) (rate(vllm:request_time_per_output_token_seconds_bucket{{le="{tpot}"}}[5m]))'
                          f' / sum by (model_name) (rate(vllm:request_time_per_output_token_seconds_count[5m])))'})
    return {"groups": [
        {"name": "slo-sli", "rules": recording},
        {"name": "slo-budget", "interval": "1m", "rules": budget_rules},
        {"name": "slo-alerts", "rules": alerts},
    ]}


def render_slo_rules(cfg_path: Path, fleet: FleetConfig, period: str | None = None,
                     for_override: str | None = None) -> str:
    """YAML text of the generated SLO rule file, with a header naming its source; ``fleet``: the fleet
    config (runbook and dashboard bases). Raises SloConfigError (an input error) for a bad SLO file."""
    cfg = load_config(cfg_path)
    head = (f"# GENERATED by `gpuobs rules slo` from prometheus/slo.yaml (period {period or cfg['period']}) -- "
            "do not edit by hand.\n")
    return head + yaml.safe_dump(slo_rules(cfg, fleet, period, for_override), sort_keys=False, width=4096)
