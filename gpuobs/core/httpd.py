"""The HTTP base every gpuobs server uses (exporter, NVML exporter, pager, canary serve).

One place for what every server must get right: HTTP/1.1 keep-alive with an exact
``Content-Length`` on every answer (none on HEAD bodies), a request body limit, ``411`` when a body
comes without ``Content-Length``, ``413`` over the limit, ``400`` for undecodable JSON, the
connection closed whenever a body was left unread (so an unread body can never be parsed as the next
request), ``405`` with ``Allow`` for a method a route does not serve, access logs routed to the JSON
log at debug level, and ``500`` (never a dropped connection or a dead server) when a handler raises.

Subclasses set ``methods`` (e.g. ``{"GET": "_get", "POST": "_post"}``); HEAD is served wherever GET
is, with the same headers and no body.
"""

from __future__ import annotations

import email.utils
import json
import logging
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

#: Returned by :meth:`Handler.read_json` when it has already answered the error.
INVALID = object()
#: (second, its Date header text): the header is formatted once per second, not per answer.
_date: tuple[int, str] = (-1, "")
#: An HTTP method is a token (RFC 9110 section 9.1, tchar of section 5.6.2).
_METHOD = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}")


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with daemon threads and a listen backlog that holds a scrape burst."""

    daemon_threads = True
    request_queue_size = 128


class Handler(BaseHTTPRequestHandler):
    """Base request handler; see the module docstring."""

    protocol_version = "HTTP/1.1"
    #: Headers and body go out as two writes; with Nagle a small body waits for a delayed ACK.
    disable_nagle_algorithm = True
    #: Seconds a connection may sit idle or trickle a request before it is closed.
    timeout = 30
    #: Largest accepted request body, bytes.
    max_body_bytes = 1024 * 1024
    #: HTTP method -> name of the handler method serving it.
    methods: dict[str, str] = {"GET": "_get"}
    logger: logging.Logger = logging.getLogger("gpuobs.httpd")

    # ---- logging ------------------------------------------------------------------------------
    def log_message(self, fmt: str, *args: Any) -> None:
        self.logger.debug(fmt % args, extra={"fields": {"client": self.client_address[0]}})

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if self.logger.isEnabledFor(logging.DEBUG):  # skip formatting the access line on every scrape
            super().log_request(code, size)

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The ``Date`` header's text (RFC 7231 IMF-fixdate), formatted once per second for "now"."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        global _date
        now = int(time.time())
        second, text = _date
        if second != now:
            text = email.utils.formatdate(now, usegmt=True)
            _date = (now, text)
        return text

    # ---- answers ------------------------------------------------------------------------------
    def send_body(self, code: int, body: bytes, ctype: str = "application/json",
                  headers: dict[str, str] | None = None) -> None:
        """Answer ``code`` with ``body`` (no body bytes on HEAD, same Content-Length)."""
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        buffered = getattr(self, "_headers_buffer", None)
        if buffered is None or self.request_version == "HTTP/0.9":  # not reached: HTTP/0.9 is refused
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return
        # Status line, headers and body in one write (http.server's end_headers() writes the headers,
        # then the body would be a second write): one syscall, and the client reads one answer.
        buffered.append(b"\r\n")
        if self.command != "HEAD":
            buffered.append(body)
        self.flush_headers()

    def send_json(self, code: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        """Answer ``code`` with ``doc`` as one JSON line."""
        self.send_body(code, (json.dumps(doc) + "\n").encode(), "application/json", headers)

    def send_error_json(self, code: int, msg: str, field: str | None = None,
                        headers: dict[str, str] | None = None) -> None:
        """Answer ``{"error": msg[, "field": field]}`` with status ``code``."""
        doc: dict[str, Any] = {"error": msg}
        if field:
            doc["field"] = field
        self.send_json(code, doc, headers)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own rejections (malformed request line, HTTP/0.9 or 2.x, header limits) as a
        JSON answer with a status line, the connection closed. A version it cannot speak is the
        client's error here: 505 becomes 400 (no 5xx for any client input)."""
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # else http.server writes a bare body without a status line
        self.close_connection = True
        if code == 505:
            code = 400
        try:
            self.send_error_json(code, message or "bad request")
        except OSError:
            pass

    def parse_request(self) -> bool:
        """http.server's parsing, minus HTTP/0.9 (a request line without a version): answered 400."""
        if not super().parse_request():
            return False
        if self.request_version == "HTTP/0.9":
            self.send_error(400, "a request line needs an HTTP version (HTTP/1.0 or HTTP/1.1)")
            return False
        return True

    # ---- request bodies -----------------------------------------------------------------------
    def discard_body(self) -> None:
        """Before answering early (401/404/...) on a request that may carry a body: read it when it is
        small and announced, else close the connection after the answer."""
        raw = self.headers.get("Content-Length")
        try:
            length = int(raw) if raw is not None else 0
        except ValueError:
            length = -1
        if 0 < length <= self.max_body_bytes:
            self.rfile.read(length)
        elif length != 0 or self.headers.get("Transfer-Encoding"):
            self.close_connection = True

    def read_body(self) -> bytes | None:
        """The request body; on a missing/invalid Content-Length (411) or one over the limit (413) it
        answers the error itself, closes the connection and returns None."""
        raw = self.headers.get("Content-Length")
        try:
            length = int(raw) if raw is not None else -1
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self.send_error_json(411, "Content-Length header required")
            return None
        if length > self.max_body_bytes:
            self.close_connection = True
            self.send_error_json(413, f"body is {length} bytes; the limit is {self.max_body_bytes}")
            return None
        return self.rfile.read(length)

    def read_json(self) -> Any:
        """The decoded JSON body, or :data:`INVALID` after answering 411/413/400 itself."""
        raw = self.read_body()
        if raw is None:
            return INVALID
        try:
            return json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # bad UTF-8/JSON, huge integers, absurd nesting
            self.send_error_json(400, f"body is not valid JSON: {str(exc)[:200]}", "body")
            return INVALID

    # ---- dispatch -----------------------------------------------------------------------------
    def __getattr__(self, name: str):
        # http.server answers 501 for a method without a do_<METHOD> attribute; route every method
        # here instead, so an unknown one gets 405 + Allow (or 400 when it is not a token at all).
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)

    def _dispatch(self) -> None:
        if not _METHOD.fullmatch(self.command or ""):
            self.close_connection = True
            self.send_error_json(400, "malformed request method")
            return
        method = "GET" if self.command == "HEAD" else self.command
        name = self.methods.get(method)
        if name is None:
            self.discard_body()
            allow = sorted(set(self.methods) | ({"HEAD"} if "GET" in self.methods else set()))
            self.send_error_json(405, f"method {self.command} not allowed; allowed: {', '.join(allow)}",
                                 headers={"Allow": ", ".join(allow)})
            return
        self.guard(getattr(self, name))

    def guard(self, fn: Callable[[], None]) -> None:
        """Run a route; a client that went away is ignored, any other exception answers 500."""
        try:
            fn()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception:  # one bad request must never take the server down
            self.logger.exception("request failed", extra={"fields": {"path": self.path}})
            self.close_connection = True
            try:
                self.send_error_json(500, "internal error; see the server log")
            except OSError:
                pass

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _dispatch
