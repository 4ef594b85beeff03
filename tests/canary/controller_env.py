"""Shared set-up of the controller-semantics tests: a CanaryServer on 127.0.0.1 in front of a
:class:`tests.fakes.canary_traffic.Traffic` backend, on a simulated clock, restartable over one state dir."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from gpuobs.canary.config import load_config
from gpuobs.canary.runs import RunStore
from gpuobs.canary.serve import CanaryServer
from gpuobs.core.fleet import shipped_fleet
from gpuobs.mixin.kubernetes import load_docs, render
from gpuobs.promapi.prometheus import PromClient
from tests.fakes.prometheus import FakePrometheus

T0 = 1_800_000_000.0


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def set(self, t: float) -> None:
        self.t = t


class Env:
    """Backend + server; :meth:`restart` replaces the server with a new one over the same state dir."""

    def __init__(self, traffic: Any, state_dir: Path | None, look_deadline_s: float = 60.0):
        self.traffic, self.state_dir, self.deadline = traffic, state_dir, look_deadline_s
        self.clock = Clock(T0)
        self.fake = FakePrometheus(traffic).__enter__()
        self.config = load_config(None)
        self.srv: CanaryServer | None = None
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        store = RunStore(self.state_dir)
        self.srv = CanaryServer(("127.0.0.1", 0), PromClient(self.fake.url, retries=0, timeout=5.0), self.config,
                                clock=self.clock, store=store, look_deadline_s=self.deadline)
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.srv.server_address[1]}"

    def restart(self) -> None:
        self._stop_server()
        self.restarts += 1
        self._start()

    def _stop_server(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
        self.srv.store.close()

    def close(self) -> None:
        self._stop_server()
        self.fake.__exit__()


def rendered() -> dict[str, str]:
    cfg = load_config(None)
    return render(cfg.horizon_s, cfg.interval_s, shipped_fleet())


def generated(rel: str) -> list[dict]:
    """The documents of a generated deploy/kubernetes file, checked identical to the committed one."""
    text = rendered()[rel]
    committed = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / rel
    assert committed.read_text() == text, f"{rel} is stale: run `gpuobs rules kubernetes`"
    return load_docs(text)
