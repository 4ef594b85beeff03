"""Runbook URLs of the alerts: ``<base>/runbooks/<file>.md#<alertname-lowercase>`` (design §6).

Every generated and hand-written rule links its runbook this way; the stack rewrites the base to the
configured one when it renders the rules.
"""

from __future__ import annotations

#: Default runbook base: the local pager serves runbooks/ (rewritten by the stack when configured).
RUNBOOK_BASE = "http://127.0.0.1:9097"


def runbook_url(file: str, alertname: str) -> str:
    """``<base>/runbooks/<file>.md#<alertname-lowercase>`` (design §6)."""
    return f"{RUNBOOK_BASE}/runbooks/{file}.md#{alertname.lower()}"
