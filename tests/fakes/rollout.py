"""Fakes for the rollout controller's unit tests: clock, fleet, Prometheus signals, scripted analyzer.

Nothing here sleeps: :class:`FakeClock` advances its own time when the controller "sleeps".
Verdicts are real :class:`gpuobs.canary.verdict.Verdict` objects built by :func:`make_verdict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from gpuobs.canary.analyzer import AnalysisState
from gpuobs.canary.verdict import MetricResult, Verdict, assumptions, combine, deciding_tests
from gpuobs.compat.inventory import InventoryRow
from gpuobs.rollout.controller import Controller
from gpuobs.rollout.interfaces import FleetError, SignalsUnavailable
from gpuobs.rollout.model import BudgetRow, RolloutSpec
from gpuobs.rollout.store import RolloutStore

HOSTS = ("gpu-node-00", "gpu-node-01", "gpu-node-02")
H100, DRIVER = "NVIDIA H100 80GB HBM3", "550.54.15"
T0 = 1_800_000_000.0
#: The node-spread assumption as the analyzer words it for a 3-node fleet (every fake verdict rests on it).
ASSUMPTION = ("node-to-node variation from 2 baseline and 1 canary instance(s) (1 df) pooled with the assumed "
              "node_spread 1.5% (4 df, 80% of the weight); a canary instance that differs from the baseline by more "
              "than the assumed spread can be rolled back (more baseline instances let the data decide)")


class Crash(BaseException):
    """Simulates the controller process dying (not an Exception: nothing in the controller catches it)."""


class FakeClock:
    """Unix time that moves only when :meth:`sleep` is called."""

    def __init__(self, t: float = T0):
        self.t = t
        self.slept = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.t += s
        self.slept += s


@dataclass
class FakeFleet:
    """Versions per host; records deploy calls and label changes. ``fail`` hosts raise FleetError on
    deploy; ``crash_after_deploy`` hosts change version and then raise :class:`Crash`."""

    versions: dict[str, str] = field(default_factory=lambda: dict.fromkeys(HOSTS, "1.4.0"))
    deploys: list[tuple[str, str]] = field(default_factory=list)
    labels: list[set[str] | None] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)
    crash_after_deploy: set[str] = field(default_factory=set)

    def version(self, host: str) -> str:
        return self.versions[host]

    def deploy(self, host: str, version: str) -> str:
        if host in self.fail:
            raise FleetError(f"{host}: admin API unreachable")
        previous, self.versions[host] = self.versions[host], version
        self.deploys.append((host, version))
        if host in self.crash_after_deploy:
            self.crash_after_deploy.discard(host)
            raise Crash(f"killed right after deploying {host}")
        return previous

    def label_snapshot(self) -> dict[str, Any]:
        return {"dcgm": [[h, 9400 + i, {}] for i, h in enumerate(self.versions)],
                "vllm": [[h, 8000 + i, {}] for i, h in enumerate(self.versions)]}

    def apply_labels(self, snapshot: dict[str, Any], canary: set[str] | None) -> None:
        self.labels.append(None if canary is None else set(canary))

    @property
    def canary(self) -> set[str]:
        """Hosts labelled canary now (empty when labels are restored)."""
        return set(self.labels[-1]) if self.labels and self.labels[-1] is not None else set()


@dataclass
class FakeSignals:
    """Prometheus as the controller sees it. ``budget_fn(now)`` / ``pages_fn(now)`` let a test change
    the answers over (fake) time; ``errors`` raise SignalsUnavailable on that many next calls."""

    clock: FakeClock
    inventory_rows: list[InventoryRow] = field(
        default_factory=lambda: [InventoryRow(h, H100, DRIVER, 2) for h in HOSTS])
    budget_fn: Callable[[float], list[BudgetRow]] = lambda now: [BudgetRow({"slo": "ttft"}, 0.8),
                                                                BudgetRow({"slo": "availability"}, 0.95)]
    pages_fn: Callable[[float], set[str]] = lambda now: set()
    errors: int = 0
    calls: list[str] = field(default_factory=list)

    def _maybe_fail(self, what: str) -> None:
        self.calls.append(what)
        if self.errors > 0:
            self.errors -= 1
            raise SignalsUnavailable("Prometheus at http://prometheus.test unavailable after 4 attempt(s): connection refused")

    def inventory(self) -> list[InventoryRow]:
        self._maybe_fail("inventory")
        return list(self.inventory_rows)

    def budget(self) -> list[BudgetRow]:
        self._maybe_fail("budget")
        return self.budget_fn(self.clock())

    def pages(self) -> set[str]:
        self._maybe_fail("pages")
        return self.pages_fn(self.clock())


def make_verdict(name: str, start: float, end: float, horizon_s: float, effect: float = 0.0) -> Verdict:
    """A real Verdict whose critical TTFT metric is classified to give ``name``; reasons, deciding tests
    and assumptions as the analyzer makes them (:func:`gpuobs.canary.verdict.combine`), the TTFT
    metric resting on :data:`ASSUMPTION`."""
    cls, harm, iv = {"PROMOTE": ("Pass", False, (effect - 0.05, effect + 0.05)),
                     "ROLLBACK": ("High", True, (effect - 0.08, effect + 0.08)),
                     "HOLD": ("Inconclusive", False, (effect - 0.3, effect + 0.3))}[name]
    ttft = MetricResult("ttft", "time to first token", "histogram", "s", "relative", "increase", True, 0.007,
                        classification=cls, harmful=harm, effect=effect, interval=iv,
                        baseline={"p50": 0.25, "p90": 0.6, "p99": 1.1}, canary={"p50": 0.25 * (1 + effect),
                                                                                  "p90": 0.6, "p99": 1.3},
                        evidence={"z": effect / 0.03, "boundary": 2.7}, n_canary=600.0, n_baseline=1200.0,
                        notes=["node sd 2.7% used (the node_spread assumption carries 80% of the weight)"],
                        assumption=ASSUMPTION)
    frac = (end - start) / horizon_s
    verdict, reasons, warnings = combine([ttft])
    assert verdict == name
    return Verdict(name, reasons, warnings, [ttft], 'track="canary"', 'track="baseline"', start, end, frac, frac >= 1,
                   0.01, deciding=deciding_tests([ttft]) if name == "ROLLBACK" else [], assumptions=assumptions([ttft]))


class ScriptedAnalyzers:
    """Analyzer factory whose verdicts follow ``script[number of canary hosts]`` (a list of verdict
    names, one per look; the last repeats). An entry "ERROR" raises SignalsUnavailable and
    "CRASH" raises :class:`Crash`. Records every look as (canary hosts, start, end)."""

    def __init__(self, fleet: FakeFleet, script: dict[int, list[str]], effects: dict[str, float] | None = None):
        self.fleet, self.script = fleet, script
        self.effects = effects or {"PROMOTE": -0.02, "ROLLBACK": 0.2, "HOLD": 0.01}
        self.looks: list[tuple[int, float, float]] = []
        self.made: list[tuple[float, float]] = []

    def __call__(self, horizon_s: float, interval_s: float) -> "ScriptedAnalyzers._One":
        self.made.append((horizon_s, interval_s))
        return ScriptedAnalyzers._One(self, horizon_s)

    class _One:
        def __init__(self, parent: "ScriptedAnalyzers", horizon_s: float):
            self.parent, self.horizon_s = parent, horizon_s

        def analyze(self, start: float, end: float, state: AnalysisState) -> Verdict:
            p = self.parent
            n = len(p.fleet.canary)
            done = sum(1 for c, _, _ in p.looks if c == n)
            p.looks.append((n, start, end))
            steps = p.script[n]
            name = steps[min(done, len(steps) - 1)]
            if name == "ERROR":
                raise SignalsUnavailable("Prometheus at http://prometheus.test unavailable after 4 attempt(s): HTTP 503")
            if name == "CRASH":
                raise Crash(f"killed during look {done + 1} with {n} canary host(s)")
            state.looks.setdefault("ttft", []).append(((end - start) / self.horizon_s, float(done + 1)))
            return make_verdict(name, start, end, self.horizon_s, p.effects[name])


def spec(**kw: Any) -> RolloutSpec:
    """A 3-host spec: stages 1, 2, 3 nodes; 10 s looks, 60 s stage timeout, 5 s settle, 10 s bake."""
    base = dict(version="1.5.0", engine="vllm==0.11.0", cuda="12.8", hosts=HOSTS, stages=(1, 2, 3), interval_s=10.0,
                stage_timeout_s=60.0, settle_s=5.0, bake_s=10.0, error_limit=3, override_reason="")
    base.update(kw)
    return RolloutSpec(**base)


@dataclass
class Rig:
    """Everything one test needs, wired together."""

    store: RolloutStore
    clock: FakeClock
    fleet: FakeFleet
    signals: FakeSignals
    analyzers: ScriptedAnalyzers
    controller: Controller
    lines: list[str]


def rig(tmp_path: Any, script: dict[int, list[str]], fleet: FakeFleet | None = None, tracer: Any = None,
        clock: FakeClock | None = None, **signal_kw: Any) -> Rig:
    """A controller over fakes, its store in ``tmp_path/rollout.sqlite``."""
    clock = clock or FakeClock()
    fleet = fleet or FakeFleet()
    signals = FakeSignals(clock, **signal_kw)
    analyzers = ScriptedAnalyzers(fleet, script)
    store = RolloutStore(tmp_path / "rollout.sqlite", clock=clock)
    lines: list[str] = []
    ctl = Controller(store, fleet, signals, analyzers, clock=clock, sleep=clock.sleep, out=lines.append, tracer=tracer)
    return Rig(store, clock, fleet, signals, analyzers, ctl, lines)
