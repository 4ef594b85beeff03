"""One wording for "that server cannot be reached", whatever HTTP library failed.

requests/urllib3 describe a refused connection as ``HTTPConnectionPool(host=..., port=...): Max retries
exceeded with url: ... (Caused by NewConnectionError(...))``, which names neither the component nor what
to do. :func:`unreachable` turns such an exception into ``cannot reach the <component> at <url>
(<reason>)``; the CLI (:func:`gpuobs.cli.common.fail`) appends how to fix it (start the stack or pass the
component's URL flag), so every command says it the same way.
"""

from __future__ import annotations

import re
import socket

#: What :func:`unreachable` messages look like: group 1 the component, group 2 the URL.
PATTERN = re.compile(r"cannot reach (?:the )?(.+?) at (\S+) \(")


def _chain(exc: BaseException, seen: set[int] | None = None):
    """``exc`` and every exception it wraps (cause, context, urllib3's ``reason``, exception args)."""
    seen = set() if seen is None else seen
    if id(exc) in seen:
        return
    seen.add(id(exc))
    yield exc
    for inner in (exc.__cause__, exc.__context__, getattr(exc, "reason", None), *getattr(exc, "args", ())):
        if isinstance(inner, BaseException):
            yield from _chain(inner, seen)


def reason(exc: BaseException) -> str:
    """A few words for why a connection failed: connection refused, timed out, host not found ..."""
    chain = list(_chain(exc))
    names = " ".join(type(e).__name__ for e in chain)
    text = " ".join(str(e) for e in chain[:3])
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "Connection refused" in text:
        return "connection refused"
    if any(isinstance(e, socket.gaierror) for e in chain) or "Name or service not known" in text \
            or "NameResolutionError" in names:
        return "host name not found"
    if any(isinstance(e, (TimeoutError, socket.timeout)) for e in chain) or "Timeout" in names:
        return "timed out"
    if any(isinstance(e, ConnectionResetError) for e in chain) or "reset by peer" in text:
        return "connection reset"
    if "SSLError" in names:
        return "TLS handshake failed"
    if any(isinstance(e, OSError) and getattr(e, "strerror", None) for e in chain):
        err = next(e for e in chain if isinstance(e, OSError) and getattr(e, "strerror", None))
        return str(err.strerror).lower()
    return "connection failed"


def base_url(url: str) -> str:
    """``scheme://host:port`` of ``url`` (what the user passed or the stack recorded, without the path)."""
    m = re.match(r"([a-zA-Z][\w+.-]*://[^/?#]+)", url or "")
    return m.group(1) if m else url


def unreachable(component: str, url: str, exc: BaseException) -> str:
    """``cannot reach [the] <component> at <scheme://host:port> (<reason>)``: one line, no library text."""
    article = "the " if component[:1].islower() else ""  # the pager; Prometheus, Alertmanager
    return f"cannot reach {article}{component} at {base_url(url)} ({reason(exc)})"


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` (a requests/urllib3 exception or an OSError) means the server was not reached,
    as opposed to an answer the server gave."""
    names = {type(e).__name__ for e in _chain(exc)}
    return bool(names & {"ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout", "NewConnectionError",
                         "MaxRetryError", "ConnectionRefusedError", "ConnectionResetError", "TimeoutError",
                         "NameResolutionError", "gaierror", "ProtocolError", "SSLError"})
