"""Receiving one Alertmanager webhook (version 4) on a gpuobs server: the pager's ``/hook/page`` and
``/hook/ticket`` and the remediation controller's ``/hook/remediate`` share it.

``Authorization: Bearer <token>`` is checked before the body is read (401 with ``WWW-Authenticate``
otherwise; the body is discarded), the body is decoded (411/413/400 from :mod:`gpuobs.core.httpd`) and
validated (:func:`gpuobs.pager.store.validate`: 400 naming the field)."""

from __future__ import annotations

import logging

from gpuobs.core import httpd, tokens
from gpuobs.pager.store import PayloadError, validate


def read_payload(handler: httpd.Handler, token: str | None, realm: str, log: logging.Logger) -> dict | None:
    """The validated payload, or None after ``handler`` answered the error itself."""
    if not tokens.bearer_ok(handler.headers.get("Authorization"), token):
        handler.discard_body()
        handler.send_json(401, {"error": "missing or wrong bearer token (Authorization: Bearer <token>)"},
                          headers={"WWW-Authenticate": f'Bearer realm="{realm}"'})
        return None
    doc = handler.read_json()
    if doc is httpd.INVALID:
        return None
    try:
        return validate(doc)
    except PayloadError as exc:
        log.warning("rejected payload", extra={"fields": {"field": exc.field, "error": str(exc)}})
        handler.send_json(400, {"error": str(exc), "field": exc.field})
        return None
