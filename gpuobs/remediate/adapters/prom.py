"""The remediation controller's :class:`~gpuobs.remediate.interfaces.Signals`: Prometheus's ``ALERTS``
series for "is the alert still firing", and the rollout store for the nodes a rollout holds.

* ``firing(node, alertname)``: ``ALERTS{alertname="...", alertstate="firing", <identity>="node"}`` at now
  (Prometheus writes one ``ALERTS`` sample per active alert at each evaluation, labels = the alert's:
  prometheus/prometheus ``rules/alerting.go`` ``sample()``; VictoriaMetrics' vmalert writes the same
  series to its remote-write target). Any answer Prometheus cannot give raises ActionError: the
  controller never reads an outage as "clear".
* ``rollout_holds()``: every node of every rollout (releases, flags, driver upgrades) that is not
  terminal, from ``<run>/rollout.sqlite``, ``<run>/flag.sqlite`` and ``<run>/upgrade.sqlite``
  (:class:`gpuobs.rollout.store.RolloutStore`); ``abort_rollout`` sets the rollout's ``abort_reason``,
  which its controller applies at its next step by rolling back (what ``gpuobs rollout abort`` does).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpuobs.promapi.prometheus import PromClient, PrometheusError
from gpuobs.remediate.interfaces import ActionError
from gpuobs.rollout.model import TERMINAL
from gpuobs.rollout.store import RolloutStore

ROLLOUT_DBS = ("rollout.sqlite", "flag.sqlite", "upgrade.sqlite")


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class PromSignals:
    """``prom``: the Prometheus holding the alert rules' ``ALERTS``; ``identity_label``: the fleet
    config's node label; ``run_dir``: where the rollout stores live (None: no rollouts to respect)."""

    def __init__(self, prom: PromClient, identity_label: str, run_dir: Path | None = None):
        self.prom, self.identity_label, self.run_dir = prom, identity_label, run_dir

    def firing(self, node: str, alertname: str, gpu: int | None = None) -> bool:
        gpu_match = "" if gpu is None else f', gpu="{int(gpu)}"'
        expr = (f'ALERTS{{alertname={_quote(alertname)}, alertstate="firing", '
                f'{self.identity_label}={_quote(node)}{gpu_match}}}')
        try:
            return not self.prom.query(expr).empty
        except PrometheusError as exc:
            raise ActionError(f"Prometheus: {exc}") from None

    def _stores(self) -> list[RolloutStore]:
        if self.run_dir is None:
            return []
        stores = []
        for name in ROLLOUT_DBS:
            path = self.run_dir / name
            if path.exists():
                try:
                    stores.append(RolloutStore(path))
                except sqlite3.Error as exc:
                    raise ActionError(f"rollout store {path}: {exc}") from None
        return stores

    def rollout_holds(self) -> dict[str, str]:
        holds: dict[str, str] = {}
        for store in self._stores():
            try:
                rec = store.latest(active_only=True, terminal=TERMINAL)
                if rec is not None:
                    for st in store.stages(rec.id):
                        for host in st.hosts:
                            holds.setdefault(host, rec.id)
                    for n in store.nodes(rec.id):
                        holds.setdefault(n.hostname, rec.id)
            except sqlite3.Error as exc:
                raise ActionError(f"rollout store {store.path}: {exc}") from None
            finally:
                store.close()
        return holds

    def abort_rollout(self, rollout_id: str, reason: str) -> None:
        for store in self._stores():
            try:
                try:
                    rec = store.get(rollout_id)
                except KeyError:
                    continue
                if rec.state not in TERMINAL and not rec.abort_reason:
                    store.update(rollout_id, abort_reason=f"remediation: {reason}")
                return
            except sqlite3.Error as exc:
                raise ActionError(f"rollout store {store.path}: {exc}") from None
            finally:
                store.close()
        raise ActionError(f"no rollout {rollout_id!r} under {self.run_dir}")
