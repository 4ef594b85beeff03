"""Escalation policy: an unacknowledged open incident escalates after N minutes to a secondary receiver.

Config (YAML, ``gpuobs pager --escalation-config FILE``)::

    escalation:
      after: 15m                 # open and unacknowledged this long (gpuobs duration grammar), > 0
      receiver: secondary-oncall # name recorded on the incident's timeline
      channels: [page]           # which incidents escalate (page|ticket; default [page])
      webhook_url: http://127.0.0.1:9099/escalate   # optional: POSTed the incident JSON

An incident escalates once per opening: the clock starts when it opens or re-opens
(``open_since``), an acknowledgement stops it, a re-open starts it afresh. Escalating records an
``escalated`` row on the timeline (receiver, after_s, and ``delivered`` true/false when a webhook is
set, with the error when it failed). Checks run every ``check_interval_s`` seconds in the pager
(:class:`Escalator`); :func:`gpuobs.pager.store.PageStore.escalate_due` takes ``now`` so tests
drive time explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuobs.core import log
from gpuobs.core.durations import DurationError, parse_duration
from gpuobs.core.errors import InputError
from gpuobs.pager.periodic import Periodic

_log = log.get("pager.escalation")


class EscalationConfigError(InputError):
    """A bad escalation config; the message names the field."""


@dataclass(frozen=True)
class Policy:
    """After ``after_s`` seconds open and unacknowledged, escalate to ``receiver``."""

    after_s: float
    receiver: str
    channels: tuple[str, ...] = ("page",)
    webhook_url: str | None = None


def parse(doc: Any, where: str = "escalation config") -> Policy:
    """A Policy from a decoded YAML document; raises EscalationConfigError naming the field."""
    if not isinstance(doc, dict) or not isinstance(doc.get("escalation"), dict):
        raise EscalationConfigError(f"{where}: expected a mapping with key 'escalation'")
    e = doc["escalation"]
    unknown = set(e) - {"after", "receiver", "channels", "webhook_url"}
    if unknown:
        raise EscalationConfigError(f"{where}: escalation.{sorted(unknown)[0]}: unknown field; allowed: after, "
                                    "receiver, channels, webhook_url")
    try:
        after = parse_duration(str(e.get("after", "")), "escalation.after")
    except DurationError as exc:
        raise EscalationConfigError(f"{where}: {exc}") from None
    receiver = e.get("receiver")
    if not isinstance(receiver, str) or not receiver.strip():
        raise EscalationConfigError(f"{where}: escalation.receiver: must be a non-empty string")
    channels = e.get("channels", ["page"])
    if not isinstance(channels, list) or not channels or any(c not in ("page", "ticket") for c in channels):
        raise EscalationConfigError(f"{where}: escalation.channels: must be a non-empty list of page, ticket")
    url = e.get("webhook_url")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise EscalationConfigError(f"{where}: escalation.webhook_url: must be an http(s) URL")
    return Policy(after, receiver.strip(), tuple(channels), url)


def load(path: Path) -> Policy:
    """Read and parse a config file; raises EscalationConfigError."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise EscalationConfigError(f"{path}: cannot read: {exc}") from None
    return parse(doc, str(path))


class Escalator(Periodic):
    """Background checker: every ``check_interval_s`` escalates what is due (daemon thread)."""

    failure = "escalation check failed"

    def __init__(self, store: Any, policy: Policy, check_interval_s: float = 5.0):
        super().__init__(check_interval_s, "escalator")
        self.store, self.policy, self.check_interval_s = store, policy, check_interval_s

    def check(self, now: float) -> list[int]:
        """Escalate every due incident at ``now``; returns their ids."""
        due = self.store.escalate_due(now, self.policy)
        for inc in due:
            delivered, error = None, None
            if self.policy.webhook_url:
                delivered, error = self._notify(inc)
            self.store.record_escalation(inc["id"], now, self.policy, delivered, error)
            _log.warning("incident escalated", extra={"fields": {
                "incident": inc["id"], "receiver": self.policy.receiver, "delivered": delivered}})
        return [i["id"] for i in due]

    def _notify(self, inc: dict) -> tuple[bool, str | None]:
        import requests

        body = {"receiver": self.policy.receiver, "after_s": self.policy.after_s, "incident": inc}
        try:
            resp = requests.post(self.policy.webhook_url, json=body, timeout=5)
            if resp.status_code >= 300:
                return False, f"HTTP {resp.status_code}"
            return True, None
        except requests.RequestException as exc:
            return False, str(exc)[:300]
