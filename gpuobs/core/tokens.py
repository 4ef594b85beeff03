"""Bearer tokens of the gpuobs servers (pager webhooks, canary serve), kept in owner-only files.

A token file holds one line: the token (``secrets.token_urlsafe(32)``, 43 URL-safe characters, when
gpuobs generates it). Servers compare with :func:`hmac.compare_digest`; clients send
``Authorization: Bearer <token>`` (Alertmanager: webhook ``http_config.authorization.credentials_file``,
Argo Rollouts: the web provider's ``headers``, Flagger: the webhook's ``metadata`` or headers; see
docs/on-call.md and docs/canary.md).
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from gpuobs.core.errors import InputError


class TokenError(InputError):
    """A token file that exists but cannot be used (unreadable, empty, several lines)."""


def read(path: Path) -> str:
    """The token in ``path``. Raises TokenError naming the file when it is unreadable or empty."""
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenError(f"token file {path}: cannot read it ({exc})") from None
    if not value or "\n" in value or any(c.isspace() for c in value):
        raise TokenError(f"token file {path}: must hold one token on one line (no spaces)")
    return value


def load_or_create(path: Path) -> str:
    """The token in ``path``; when the file does not exist, a new random one written there with mode
    0600 (temp file + rename, so a reader never sees half a token). Raises TokenError."""
    if path.exists():
        return read(path)
    value = secrets.token_urlsafe(32)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(value + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise TokenError(f"token file {path}: cannot create it ({exc})") from None
    return value


def bearer_ok(header: str | None, token: str | None) -> bool:
    """True when ``token`` is None (auth off) or ``header`` is ``Bearer <token>`` (constant-time)."""
    if token is None:
        return True
    scheme, _, value = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode("utf-8", "replace"),
                                                               token.encode("utf-8"))
