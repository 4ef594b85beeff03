"""Runbook URLs of the alerts: ``<base>/runbooks/<file>.md#<alertname-lowercase>`` (runbooks/README.md).

Every generated and hand-written rule links its runbook this way, ``<base>`` being the fleet config's
``runbook_base`` (:class:`gpuobs.core.fleet.FleetConfig`); the stack rewrites the shipped files' base to
the configured one when it renders the rules.
"""

from __future__ import annotations


def runbook_url(base: str, file: str, alertname: str) -> str:
    """``<base>/runbooks/<file>.md#<alertname-lowercase>``; ``base`` without a trailing slash."""
    return f"{base.rstrip('/')}/runbooks/{file}.md#{alertname.lower()}"
