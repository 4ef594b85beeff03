"""The flag rollout's fleet adapter for the native dev stack: one flag's state per serving node.

:class:`StackFlagFleet` implements :class:`gpuobs.rollout.flag.FlagFleet` over

* the stack's flag file (``<run>/flags.json``, flagd format, :class:`gpuobs.flags.flagd.FlagFile`):
  the desired state and the only thing written. ``version(host)`` is what flagd's evaluator makes
  of the file for ``host`` (so a controller killed after a write sees the flip on resume and does
  not flip again); ``deploy(host, "<flag>=on")`` adds the host to the flag's targeting in one
  atomic write, then **confirms**: polls the node's ``GET /admin/flags`` (its engine's OpenFeature
  evaluation) until it reports the new state, or FleetError after ``confirm_s``;
* the same file_sd relabelling as version rollouts (delegated to
  :class:`gpuobs.rollout.adapters.native.StackFleet`).

``kill(reason)`` is the kill switch: :meth:`FlagFile.kill` (one write, flag off for every node and
marked killed), then a confirmation pass that waits up to ``confirm_s`` for each engine but never
fails: the file is the authority, and an engine that does not answer (down) reads it when it is back.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpuobs.flags.flagd import FILE_NAME, FlagFile, FlagFileError
from gpuobs.promapi.exporter_admin import AdminError
from gpuobs.rollout.adapters.native import StackFleet
from gpuobs.rollout.flag import parse_variant, variant
from gpuobs.rollout.interfaces import FleetError
from gpuobs.stack.state import StackState


class StackFlagFleet:
    """Flag ``flag`` on the serving nodes of the native stack ``stack``; raises FleetError only."""

    def __init__(self, stack: StackState, flag: str, flag_file: Path | str | None = None, token: str | None = None,
                 confirm_s: float = 10.0, poll_s: float = 0.05):
        self.base = StackFleet(stack, token)
        self.hosts = self.base.hosts
        self.flag = flag
        self.file = FlagFile(flag_file or Path(stack.run_dir) / FILE_NAME)
        self.confirm_s, self.poll_s = confirm_s, poll_s

    # ---- Fleet --------------------------------------------------------------------------------
    def version(self, host: str) -> str:
        """``<flag>=on|off``: the flag file's answer for ``host`` (flagd's evaluator)."""
        self._known_host(host)
        try:
            return variant(self.flag, self.file.enabled(self.flag, host))
        except FlagFileError as exc:
            raise FleetError(f"{host}: {exc}") from None

    def deploy(self, host: str, version: str) -> str:
        """Turn the flag on/off for ``host`` (one atomic write), wait for its engine to confirm; returns
        the state before."""
        self._known_host(host)
        try:
            flag, on = parse_variant(version)
        except ValueError as exc:
            raise FleetError(f"{host}: {exc}") from None
        if flag != self.flag:
            raise FleetError(f"{host}: this fleet flips {self.flag}, not {flag}")
        try:
            before = self.file.set_hosts(flag, on=[host] if on else [], off=[] if on else [host],
                                         reason=f"{version} on {host}")
        except (FlagFileError, OSError) as exc:
            raise FleetError(f"{host}: flipping {version} failed: {exc}") from None
        late = self._confirm([host], on)
        if late:
            raise FleetError(f"{host}: the engine did not report {version} within {self.confirm_s:.0f}s: {late[0]}")
        return variant(flag, host in before)

    def label_snapshot(self) -> dict[str, Any]:
        """As :meth:`StackFleet.label_snapshot`."""
        return self.base.label_snapshot()

    def apply_labels(self, snapshot: dict[str, Any], canary: set[str] | None) -> None:
        """As :meth:`StackFleet.apply_labels` (canary = the hosts the flag is on for)."""
        self.base.apply_labels(snapshot, canary)

    # ---- flags --------------------------------------------------------------------------------
    def known(self, host: str) -> bool:
        """Whether ``host``'s engine evaluates the flag (it lists it in ``GET /admin/flags``) and the
        flag file defines it."""
        self._known_host(host)
        try:
            self.file.spec(self.flag)
            return self.flag in self.base._client(host).flags()
        except FlagFileError:
            return False
        except AdminError as exc:
            raise FleetError(f"{host}: flag query failed: {exc}") from None

    def kill(self, reason: str) -> tuple[list[str], list[str]]:
        """The kill switch; returns (hosts the flag was on for, engines that did not confirm off)."""
        try:
            before = self.file.kill(self.flag, reason)
        except (FlagFileError, OSError) as exc:
            raise FleetError(f"kill switch: writing {self.file.path} failed: {exc}") from None
        return before, self._confirm(self.hosts, False)

    def clear_kill(self, reason: str) -> None:
        """Re-arm the flag for a new rollout."""
        try:
            self.file.clear_kill(self.flag, reason)
        except (FlagFileError, OSError) as exc:
            raise FleetError(f"{self.file.path}: {exc}") from None

    # ---- helpers ------------------------------------------------------------------------------
    def _known_host(self, host: str) -> None:
        if host not in self.hosts:
            raise FleetError(f"unknown node {host!r}; serving nodes: {', '.join(self.hosts)}")

    def _confirm(self, hosts: list[str], on: bool) -> list[str]:
        """Poll each host's engine until it reports the flag ``on``; returns ``"host: why"`` for those
        that did not within ``confirm_s``."""
        deadline = time.monotonic() + self.confirm_s
        waiting = {h: "no answer yet" for h in hosts}
        while waiting:
            for h in list(waiting):
                try:
                    if self.base._client(h).flags().get(self.flag) == on:
                        del waiting[h]
                    else:
                        waiting[h] = f"still reports {variant(self.flag, not on)}"
                except AdminError as exc:
                    waiting[h] = str(exc)
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(self.poll_s)
        return [f"{h}: {why}" for h, why in waiting.items()]
