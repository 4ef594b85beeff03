"""Fakes for the driver upgrade's tests: a driver fleet whose node procedure can be killed in any
phase, and a per-model scripted analyzer factory (:data:`gpuobs.rollout.driver.SelectingFactory`).

Nothing here sleeps; the clock is :class:`tests.fakes.rollout.FakeClock`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpuobs.canary.analyzer import AnalysisState
from gpuobs.canary.config import load_config
from gpuobs.compat.inventory import InventoryRow
from gpuobs.rollout.adapters.drivers import IN_UPGRADE
from gpuobs.rollout.driver import NodeUpgrade
from gpuobs.rollout.interfaces import FleetError
from tests.fakes.rollout import Crash, make_verdict

H100, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA L40S"
OLD, NEW = "550.54.15", "570.172.08"
#: Phases of the node procedure a test can kill the controller in (after the phase's calls).
PHASES = ("cordon", "drain", "install", "reload", "diag", "uncordon")


def mixed_models(h100: int = 5, l40s: int = 1) -> dict[str, str]:
    """``{host: modelName}``: ``h100`` H100 nodes then ``l40s`` L40S nodes, ``gpu-node-NN``."""
    return {f"gpu-node-{i:02d}": (H100 if i < h100 else L40S) for i in range(h100 + l40s)}


@dataclass
class FakeDriverFleet:
    """Drivers and cordons per host. ``crash_in``: ``{(host, phase)}``, the procedure raises
    :class:`Crash` right after that phase on that host (once). ``diag_fails``: ``{(modelName,
    driver)}`` whose health check fails. ``installs`` records every install call (host, driver)."""

    models: dict[str, str]
    drivers: dict[str, str] = field(default_factory=dict)
    cordoned: dict[str, str] = field(default_factory=dict)  # host -> "upgrade" | "human" | "remediation"
    crash_in: set[tuple[str, str]] = field(default_factory=set)
    diag_fails: set[tuple[str, str]] = field(default_factory=set)
    installs: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.drivers = self.drivers or dict.fromkeys(self.models, OLD)

    def _phase(self, host: str, phase: str) -> None:
        if (host, phase) in self.crash_in:
            self.crash_in.discard((host, phase))
            raise Crash(f"killed after {phase} on {host}")

    def version(self, host: str) -> str:
        return self.drivers[host] + (IN_UPGRADE if self.cordoned.get(host) == "upgrade" else "")

    def model(self, host: str) -> str:
        return self.models[host]

    def deploy(self, host: str, version: str) -> str:
        res = self.upgrade([host], version)[host]
        if res.failures:
            raise FleetError(f"{host}: health check failed: {res.failures[0]}")
        return res.previous

    def upgrade(self, hosts: list[str], version: str) -> dict[str, NodeUpgrade]:
        for h in hosts:
            if self.cordoned.get(h) in ("human", "remediation"):
                raise FleetError(f"{h} is cordoned by {self.cordoned[h]}: not touched")
        before = {h: self.drivers[h] for h in hosts}
        for phase in ("cordon", "drain"):
            for h in hosts:
                self.cordoned[h] = "upgrade"
                self._phase(h, phase)
        out = {}
        for h in hosts:
            installed = self.drivers[h] != version
            if installed:
                self.drivers[h] = version
                self.installs.append((h, version))
            self._phase(h, "install")
            out[h] = NodeUpgrade(before[h], installed)
        for h in hosts:
            self._phase(h, "reload")
        for h in hosts:
            fails = (f"driver {version}: health check failed on {self.models[h]}",) \
                if (self.models[h], version) in self.diag_fails else ()
            self._phase(h, "diag")
            if not fails:
                self.cordoned.pop(h, None)
                self._phase(h, "uncordon")
            out[h] = NodeUpgrade(out[h].previous, out[h].installed, fails)
        return out

    def label_snapshot(self) -> dict[str, Any]:
        return {}

    def apply_labels(self, snapshot: dict[str, Any], canary: set[str] | None) -> None:
        pass

    def inventory(self) -> list[InventoryRow]:
        return [InventoryRow(h, m, self.drivers[h], 8) for h, m in self.models.items()]


_HOSTS = re.compile(r'=~"([^"]*)"')


class ModelScript:
    """A :data:`~gpuobs.rollout.driver.SelectingFactory` whose verdicts follow ``script[model]`` (verdict
    names per look, the last repeating; "ERROR" raises SignalsUnavailable, "CRASH" Crash). The model of
    an analyzer is the model of its canary hosts. Records (model, canary hosts, baseline hosts, alpha,
    pre_stage_end) per analyzer made and (model, start, end) per look."""

    def __init__(self, models: dict[str, str], script: dict[str, list[str]]):
        self.models, self.script = models, script
        self.made: list[tuple[str, list[str], list[str], float, float | None]] = []
        self.looks: list[tuple[str, float, float]] = []
        self.config = load_config(None)

    def __call__(self, horizon_s: float, interval_s: float, canary: str = "", baseline: str = "",
                 history: str | None = None, pre_stage_end: float | None = None, alpha_share: float = 1.0,
                 within_only: bool = False) -> Any:
        hosts = _HOSTS.search(canary).group(1).replace("\\\\", "").split("|")
        base = _HOSTS.search(baseline).group(1).replace("\\\\", "").split("|")
        model = self.models[hosts[0]]
        cfg = self.config.with_alpha(self.config.alpha * alpha_share)
        self.made.append((model, hosts, base, cfg.alpha, pre_stage_end))
        self.within_only = getattr(self, "within_only", {})
        self.within_only[model] = within_only
        return ModelScript._One(self, model, horizon_s, cfg, canary, baseline)

    class _One:
        def __init__(self, parent: "ModelScript", model: str, horizon_s: float, config: Any, canary: str,
                     baseline: str):
            self.parent, self.model, self.horizon_s, self.config = parent, model, horizon_s, config
            self.canary, self.baseline = canary, baseline

        def analyze(self, start: float, end: float, state: AnalysisState) -> Any:
            from gpuobs.rollout.interfaces import SignalsUnavailable

            p = self.parent
            done = sum(1 for m, _, _ in p.looks if m == self.model)
            p.looks.append((self.model, start, end))
            steps = p.script[self.model]
            name = steps[min(done, len(steps) - 1)]
            if name == "ERROR":
                raise SignalsUnavailable("Prometheus at http://prometheus.test unavailable: HTTP 503")
            if name == "CRASH":
                raise Crash(f"killed during look {done + 1} of {self.model}")
            state.looks.setdefault("ttft", []).append(((end - start) / self.horizon_s, float(done + 1)))
            effect = {"PROMOTE": -0.01, "ROLLBACK": 0.08, "HOLD": 0.01}[name]
            return make_verdict(name, start, end, self.horizon_s, effect)
