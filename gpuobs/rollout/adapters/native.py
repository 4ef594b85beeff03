"""The rollout controller's real adapters: the native stack's fleet and the Prometheus signals.

* :class:`StackFleet`: serving nodes of a stack started by ``gpuobs stack up`` (``<run>/stack.json``):
  versions and deploys through each node's admin API (:class:`~gpuobs.promapi.exporter_admin.AdminClient`,
  bearer token from the run directory), and ``track`` labels through the file_sd files that
  :func:`gpuobs.stack.render.write_targets` writes (Prometheus re-reads them within its 5 s
  ``refresh_interval``).
* :class:`PromSignals`: the inventory for the compatibility gate (dcgm-exporter labels), the error
  budget (``slo:error_budget_remaining:ratio``, recorded by prometheus/rules/slo.yml, judged only
  once its window holds :data:`MIN_BUDGET_REQUESTS` requests) and the
  SLO-burn page (``ALERTS{alertname="ServingErrorBudgetBurn",severity="critical",alertstate="firing"}``).
* :func:`analyzer_factory`: the canary analyzer with ``track="canary"`` vs ``track="baseline"``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gpuobs.canary.analyzer import Analyzer
from gpuobs.canary.config import load_config
from gpuobs.compat.fleet import InventoryRow, inventory
from gpuobs.promapi.exporter_admin import AdminClient, AdminError
from gpuobs.promapi.prometheus import PromClient
from gpuobs.rollout.model import AnalyzerFactory, BudgetRow, FleetError, fmt_labels
from gpuobs.stack.render import write_targets

JOBS = ("dcgm", "vllm")
BUDGET_QUERY = "slo:error_budget_remaining:ratio"
PAGE_SELECTOR = 'alertname="ServingErrorBudgetBurn",severity="critical",alertstate="firing"'
#: Requests behind each budget series. The window is the default SLO period (30d); for a stack younger
#: than the period (the case this guard exists for) it counts the same requests the budget ratio does.
REQUESTS_QUERY = "sum by (model_name) (increase(vllm:request_success_total[30d]))"
#: 10 errors' worth of a 99.9% SLO: below this a single error swings the remaining budget by >= 10%.
MIN_BUDGET_REQUESTS = 10_000.0
CANARY_SELECTOR, BASELINE_SELECTOR = 'track="canary"', 'track="baseline"'
_HOST_LABELS = ("node", "Hostname", "track")  # written by write_targets itself, or by us


class StackFleet:
    """The serving fleet of the native stack described by ``stack`` (a loaded stack.json).

    Serving nodes are the first ``nodes - training_nodes`` hostnames; node i's admin API is
    ``urls.nodes[i]`` without ``/metrics``. Raises :class:`FleetError` (never AdminError/OSError).
    """

    def __init__(self, stack: dict[str, Any], token: str | None = None, timeout_s: float = 5.0):
        self.run = Path(stack["run_dir"])
        serving = int(stack["nodes"]) - int(stack.get("training_nodes", 0))
        self.hosts: list[str] = list(stack["hostnames"][:serving])
        try:
            token = token or Path(stack["token_file"]).read_text().strip()
        except OSError as exc:
            raise FleetError(f"admin token: {exc}") from None
        self._admin = {h: AdminClient(u.removesuffix("/metrics"), token, timeout_s)
                       for h, u in zip(stack["hostnames"], stack["urls"]["nodes"])}

    def _client(self, host: str) -> AdminClient:
        try:
            return self._admin[host]
        except KeyError:
            raise FleetError(f"unknown node {host!r}; serving nodes: {', '.join(self.hosts)}") from None

    def version(self, host: str) -> str:
        """The release ``host`` runs now (GET /admin/deploy)."""
        try:
            return self._client(host).version()
        except AdminError as exc:
            raise FleetError(f"{host}: version query failed: {exc}") from None

    def deploy(self, host: str, version: str) -> str:
        """Deploy ``version`` on ``host`` (POST /admin/deploy); returns the version it ran before."""
        try:
            return str(self._client(host).deploy(version)["previous"])
        except (AdminError, KeyError) as exc:
            raise FleetError(f"{host}: deploy {version} failed: {exc}") from None

    def label_snapshot(self) -> dict[str, Any]:
        """The current file_sd targets: ``{job: [[hostname, port, {extra labels}], ...]}`` (``track`` dropped)."""
        snap: dict[str, Any] = {}
        for job in JOBS:
            path = self.run / "prometheus" / "targets" / f"{job}-nodes.json"
            try:
                groups = json.loads(path.read_text())
                snap[job] = [[g["labels"]["node"], int(t.rsplit(":", 1)[1]),
                              {k: v for k, v in g["labels"].items() if k not in _HOST_LABELS}]
                             for g in groups for t in g["targets"]]
            except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
                raise FleetError(f"cannot read the {job} targets in {path}: {exc}") from None
        return snap

    def apply_labels(self, snapshot: dict[str, Any], canary: set[str] | None) -> None:
        """Rewrite both jobs' targets from ``snapshot``: serving hosts get ``track="canary"`` if in
        ``canary`` else ``track="baseline"``; ``canary=None`` restores the snapshot as it was."""
        try:
            for job in JOBS:
                targets = []
                for host, port, extra in snapshot[job]:
                    track = {} if canary is None or host not in self.hosts else {
                        "track": "canary" if host in canary else "baseline"}
                    targets.append((host, int(port), {**extra, **track}))
                write_targets(self.run, job, targets)
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise FleetError(f"relabelling the targets failed: {exc}") from None


class PromSignals:
    """Inventory, error budget and SLO-burn pages read from Prometheus through ``client``."""

    def __init__(self, client: PromClient, inventory_selector: str = 'job="dcgm"', budget_query: str = BUDGET_QUERY,
                 page_selector: str = PAGE_SELECTOR, requests_query: str = REQUESTS_QUERY,
                 min_requests: float = MIN_BUDGET_REQUESTS):
        self.client, self.inventory_selector = client, inventory_selector
        self.budget_query, self.page_selector = budget_query, page_selector
        self.requests_query, self.min_requests = requests_query, min_requests

    def inventory(self) -> list[InventoryRow]:
        """(Hostname, modelName, driver) rows of the dcgm job."""
        return inventory(self.client, self.inventory_selector)

    def budget(self) -> list[BudgetRow]:
        """Every error-budget series (NaN ones, i.e. no traffic in the SLO window, are skipped), with the
        request count behind it (joined on ``model_name``) so the gate can skip a window too young to judge."""
        res = self.client.query(self.budget_query)
        counts = {s.labels.get("model_name", ""): s.value for s in self.client.query(self.requests_query).samples}
        return [BudgetRow({k: v for k, v in s.labels.items() if k != "__name__"}, s.value,
                          counts.get(s.labels.get("model_name", ""), 0.0), self.min_requests)
                for s in res.samples if not math.isnan(s.value)]

    def pages(self) -> set[str]:
        """Firing SLO-burn pages, one key per alert label set (``alertname{labels}``)."""
        res = self.client.query(f"ALERTS{{{self.page_selector}}}")
        return {s.labels.get("alertname", "ALERTS") + fmt_labels(
            {k: v for k, v in s.labels.items() if k not in ("__name__", "alertname", "alertstate")})
            for s in res.samples}


def analyzer_factory(client: PromClient, config_path: str | Path | None = None) -> AnalyzerFactory:
    """A factory ``(horizon_s, interval_s) -> Analyzer`` over ``config_path`` (default: packaged metrics.yaml).

    Raises :class:`~gpuobs.canary.config.ConfigError` now if the config is bad.
    """
    base = load_config(config_path)

    def make(horizon_s: float, interval_s: float) -> Analyzer:
        return Analyzer(client, base.with_timing(horizon_s=horizon_s, interval_s=interval_s),
                        canary=CANARY_SELECTOR, baseline=BASELINE_SELECTOR)

    return make
