"""Fakes for the flag rollout controller's unit tests: a fleet whose versions are one flag's states.

Built on tests/fakes/rollout.py (clock, signals, scripted analyzer): the same controller fakes, so the
flag rollout is judged exactly like a release rollout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuobs.rollout.flag import FlagController, flag_spec, variant
from gpuobs.rollout.store import RolloutStore
from tests.fakes.rollout import HOSTS, FakeClock, FakeFleet, FakeSignals, Rig, ScriptedAnalyzers

FLAG = "spec_decode"
ON, OFF = variant(FLAG, True), variant(FLAG, False)


@dataclass
class FakeFlagFleet(FakeFleet):
    """Flag states per host (``spec_decode=off`` everywhere at first). ``kills`` records each kill
    switch (fake time, reason); ``unknown`` hosts' engines do not evaluate the flag."""

    versions: dict[str, str] = field(default_factory=lambda: dict.fromkeys(HOSTS, OFF))
    kills: list[tuple[float, str]] = field(default_factory=list)
    killed: bool = False
    unknown: set[str] = field(default_factory=set)
    clock: Any = None
    flag: str = FLAG

    def deploy(self, host: str, version: str) -> str:
        assert not (self.killed and version == ON), "a killed flag must not be turned on"
        return super().deploy(host, version)

    def known(self, host: str) -> bool:
        return host not in self.unknown

    def kill(self, reason: str) -> tuple[list[str], list[str]]:
        was_on = [h for h, v in self.versions.items() if v == ON]
        self.versions = dict.fromkeys(self.versions, OFF)
        self.killed = True
        self.kills.append((self.clock() if self.clock else 0.0, reason))
        return was_on, []

    def clear_kill(self, reason: str) -> None:
        self.killed = False


def fspec(**kw: Any):
    """Flag rollout of spec_decode on 3 hosts: stages 1, 2, 3; 10 s looks, 60 s stage timeout, 5 s settle, 10 s bake."""
    base = dict(interval_s=10.0, stage_timeout_s=60.0, settle_s=5.0, bake_s=10.0, error_limit=3, override_reason="")
    hosts, stages = kw.pop("hosts", HOSTS), kw.pop("stages", (1, 2, 3))
    base.update(kw)
    return flag_spec(FLAG, hosts, stages, **base)


def flag_rig(tmp_path: Any, script: dict[int, list[str]], fleet: FakeFlagFleet | None = None, tracer: Any = None,
             clock: FakeClock | None = None, **signal_kw: Any) -> Rig:
    """A flag controller over fakes, its store in ``tmp_path/flag.sqlite``."""
    clock = clock or FakeClock()
    fleet = fleet or FakeFlagFleet()
    fleet.clock = clock
    signals = FakeSignals(clock, **signal_kw)
    analyzers = ScriptedAnalyzers(fleet, script)
    store = RolloutStore(tmp_path / "flag.sqlite", clock=clock)
    lines: list[str] = []
    ctl = FlagController(store, fleet, signals, analyzers, clock=clock, sleep=clock.sleep, out=lines.append,
                         tracer=tracer)
    return Rig(store, clock, fleet, signals, analyzers, ctl, lines)
