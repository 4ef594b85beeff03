"""The rollout controller's signal adapters over any Prometheus-API backend.

* :class:`PromSignals`: the inventory for the compatibility gate (dcgm-exporter labels), the error
  budget (``slo:error_budget_remaining:ratio``, recorded by prometheus/rules/slo.yml, judged only
  once its window holds :data:`MIN_BUDGET_REQUESTS` requests) and the SLO-burn page
  (``ALERTS{alertname="ServingErrorBudgetBurn",severity="critical",alertstate="firing"}``).
* :func:`analyzer_factory`: the canary analyzer with ``track="canary"`` vs ``track="baseline"``.

Every Prometheus failure leaves here as :class:`~gpuobs.rollout.interfaces.SignalsUnavailable`: the
controller never sees the transport.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Callable

from gpuobs.canary.analyzer import Analyzer
from gpuobs.canary.config import load_config
from gpuobs.core.fleet import FleetConfig
from gpuobs.compat.inventory import InventoryRow, inventory
from gpuobs.promapi.prometheus import PromClient, PrometheusError
from gpuobs.rollout.interfaces import AnalyzerFactory, SignalsUnavailable
from gpuobs.rollout.model import BudgetRow, fmt_labels

BUDGET_QUERY = "slo:error_budget_remaining:ratio"
PAGE_SELECTOR = 'alertname="ServingErrorBudgetBurn",severity="critical",alertstate="firing"'
#: Requests behind each budget series. The window is the default SLO period (30d); for a stack younger
#: than the period (the case this guard exists for) it counts the same requests the budget ratio does.
REQUESTS_QUERY = "sum by (model_name) (increase(vllm:request_success_total[30d]))"
#: 10 errors' worth of a 99.9% SLO: below this a single error swings the remaining budget by >= 10%.
MIN_BUDGET_REQUESTS = 10_000.0
CANARY_SELECTOR, BASELINE_SELECTOR = 'track="canary"', 'track="baseline"'


def _insulated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Translate PrometheusError into SignalsUnavailable (same message)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PrometheusError as err:
            raise SignalsUnavailable(str(err)) from err
    return wrapper


class PromSignals:
    """Inventory, error budget and SLO-burn pages read from Prometheus through ``client``."""

    def __init__(self, client: PromClient, fleet: FleetConfig | None = None, budget_query: str = BUDGET_QUERY,
                 page_selector: str = PAGE_SELECTOR, requests_query: str = REQUESTS_QUERY,
                 min_requests: float = MIN_BUDGET_REQUESTS):
        """``fleet``: the fleet config of the Prometheus's rules (default: the default one), whose DCGM
        selector and identity label the inventory reads."""
        self.client, self.fleet = client, fleet or FleetConfig()
        self.budget_query, self.page_selector = budget_query, page_selector
        self.requests_query, self.min_requests = requests_query, min_requests

    @_insulated
    def inventory(self) -> list[InventoryRow]:
        """(node, modelName, driver) rows of the fleet config's DCGM targets, by its identity label."""
        return inventory(self.client, self.fleet.dcgm_selector, self.fleet.identity_label)

    @_insulated
    def budget(self) -> list[BudgetRow]:
        """Every error-budget series (NaN ones, i.e. no traffic in the SLO window, are skipped), with the
        request count behind it (joined on ``model_name``) so the gate can skip a window too young to judge."""
        res = self.client.query(self.budget_query)
        counts = {s.labels.get("model_name", ""): s.value for s in self.client.query(self.requests_query).samples}
        return [BudgetRow({k: v for k, v in s.labels.items() if k != "__name__"}, s.value,
                          counts.get(s.labels.get("model_name", ""), 0.0), self.min_requests)
                for s in res.samples if not math.isnan(s.value)]

    @_insulated
    def pages(self) -> set[str]:
        """Firing SLO-burn pages, one key per alert label set (``alertname{labels}``)."""
        res = self.client.query(f"ALERTS{{{self.page_selector}}}")
        return {s.labels.get("alertname", "ALERTS") + fmt_labels(
            {k: v for k, v in s.labels.items() if k not in ("__name__", "alertname", "alertstate")})
            for s in res.samples}


def analyzer_factory(client: PromClient, config_path: str | Path | None = None) -> AnalyzerFactory:
    """A factory ``(horizon_s, interval_s) -> Analyzer`` over ``config_path`` (default: packaged metrics.yaml),
    judging ``track="canary"`` against ``track="baseline"``.

    Keywords for a caller that selects its cohorts itself (a driver upgrade, :mod:`gpuobs.rollout.driver`):
    ``canary``, ``baseline``, ``history`` (matchers; see :class:`~gpuobs.canary.analyzer.Analyzer`),
    ``pre_stage_end`` (unix seconds) and ``alpha_share`` (this analysis's share of the config's family-wise
    alpha, 0 < share <= 1: a driver upgrade splits it between the GPU models it judges) and ``within_only``
    (latency judged in the within-node design only: the baseline is another GPU model). Raises :class:`~gpuobs.canary.config.ConfigError` now if the config is bad.
    """
    base = load_config(config_path)

    def make(horizon_s: float, interval_s: float, canary: str = CANARY_SELECTOR, baseline: str = BASELINE_SELECTOR,
             history: str | None = None, pre_stage_end: float | None = None,
             alpha_share: float = 1.0, within_only: bool = False) -> InsulatedAnalyzer:
        cfg = base.with_timing(horizon_s=horizon_s, interval_s=interval_s)
        return InsulatedAnalyzer(Analyzer(client, cfg if alpha_share == 1.0 else cfg.with_alpha(cfg.alpha * alpha_share),
                                          canary=canary, baseline=baseline, history=history,
                                          pre_stage_end=pre_stage_end, within_only=within_only))

    return make


class InsulatedAnalyzer:
    """An :class:`~gpuobs.canary.analyzer.Analyzer` whose backend failures raise SignalsUnavailable."""

    def __init__(self, analyzer: Analyzer):
        self.analyzer = analyzer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.analyzer, name)

    @_insulated
    def analyze(self, *args: Any, **kwargs: Any) -> Any:
        return self.analyzer.analyze(*args, **kwargs)
