"""A bounded HTTP fuzzer for the gpuobs servers: raw-socket requests, seeded, with a deadline each.

Each case is raw bytes sent on a fresh connection, then the write side is closed (so a short body
ends in EOF, never in a wait), and every response is read until the server closes. An outcome is
the list of status codes, whether the server closed the connection, and whether the deadline
passed first (a hang). Responses are parsed with their Content-Length (HEAD: no body), so a hostile
path echoed in an error body can never look like a second response.
"""

from __future__ import annotations

import json
import random
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Outcome:
    statuses: list[int] = field(default_factory=list)
    closed: bool = False
    hung: bool = False
    bodies: list[bytes] = field(default_factory=list)
    error: str = ""
    raw: bytes = b""
    elapsed_s: float = 0.0


def parse_responses(data: bytes, head: bool) -> tuple[list[int], list[bytes]]:
    """Status codes and bodies of the HTTP/1.x responses in ``data``."""
    statuses, bodies = [], []
    while data:
        end = data.find(b"\r\n\r\n")
        if end < 0 or not data.startswith(b"HTTP/1."):
            break
        head_lines = data[:end].split(b"\r\n")
        try:
            code = int(head_lines[0].split()[1])
        except (IndexError, ValueError):
            break
        length = 0
        for line in head_lines[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v.strip() or 0)
        if head:
            length = 0
        statuses.append(code)
        bodies.append(data[end + 4:end + 4 + length])
        data = data[end + 4 + length:]
    return statuses, bodies


def exchange(port: int, raw: bytes, deadline_s: float = 10.0, half_close: bool = True, keep: bool = False) -> Outcome:
    """Send ``raw`` to 127.0.0.1:``port`` and read until the server closes or ``deadline_s`` passes
    (``keep``: keep the request bytes in the outcome, for failure messages)."""
    out = Outcome(raw=raw if keep else b"")
    t_end = time.monotonic() + deadline_s
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=deadline_s)
    except OSError as exc:
        out.error = f"connect: {exc}"
        return out
    data = b""
    try:
        try:
            s.sendall(raw)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server answered early and closed: read what it sent
        while True:
            left = t_end - time.monotonic()
            if left <= 0:
                out.hung = True
                break
            s.settimeout(left)
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                out.hung = True
                break
            except OSError:
                out.closed = True
                break
            if not chunk:
                out.closed = True
                break
            data += chunk
    finally:
        s.close()
    out.statuses, out.bodies = parse_responses(data, raw.startswith(b"HEAD "))
    out.elapsed_s = deadline_s - max(0.0, t_end - time.monotonic())
    return out


# ---- hostile values --------------------------------------------------------------------------------
HOSTILE_VALUES = [None, True, 0, -1, 2 ** 64, 10 ** 400, 1.8e308, -0.0, "", " ", "\u0000", "\ud800", "A" * 70_000,
                  "<script>alert(1)</script>", "../../etc/passwd", "%00", "'; DROP TABLE notifications; --",
                  [], {}, [[[[[]]]]], {"a": {"b": {"c": {}}}}, "NaN", "Infinity", "1e999", "-1", "0x10",
                  "javascript:alert(1)", "http://evil.example/", "9" * 5000]
HOSTILE_TEXT = ["", "inf", "-inf", "nan", "NaN", "1e12", "1e309", "-5m", "0", "0s", "5x", "9" * 400, "1h1h", "30d",
                "%00", "%ff%fe", "\u00e9", "1" * 20, "2025-13-45T99:99:99Z", "0001-01-01T00:00:00Z",
                "9999-12-31T23:59:59Z", "${jndi:ldap://x}", "<script>", "5m&window=inf"]


def mutate_json(doc, rng: random.Random, depth: int = 0):
    """A copy of ``doc`` with one random value replaced by a hostile one (or a key dropped/added)."""
    if depth > 6 or not isinstance(doc, (dict, list)) or not doc or rng.random() < 0.2:
        return rng.choice(HOSTILE_VALUES)
    doc = json.loads(json.dumps(doc))
    if isinstance(doc, dict):
        key = rng.choice(list(doc))
        r = rng.random()
        if r < 0.15:
            del doc[key]
        elif r < 0.25:
            doc[rng.choice(HOSTILE_TEXT) or "k"] = rng.choice(HOSTILE_VALUES)
        else:
            doc[key] = mutate_json(doc[key], rng, depth + 1)
    else:
        i = rng.randrange(len(doc))
        doc[i] = mutate_json(doc[i], rng, depth + 1)
    return doc


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def request(method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None,
            version: str = "HTTP/1.1", content_length: str | None = "auto") -> bytes:
    """Raw request bytes; ``content_length`` "auto" (the body's length), None (no header) or a literal."""
    lines = [f"{method} {path} {version}", "Host: 127.0.0.1"]
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    if body is not None and content_length == "auto":
        lines.append(f"Content-Length: {len(body)}")
    elif content_length not in (None, "auto"):
        lines.append(f"Content-Length: {content_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + (body or b"")


def protocol_cases(rng: random.Random, routes: list[str], auth: dict[str, str]) -> list[bytes]:
    """Request-line, header and framing abuse, the same for every server."""
    p = rng.choice(routes)
    return [
        b"\r\n\r\n", b"GARBAGE\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET / FOO/1.1\r\n\r\n",
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", b"G\x00ET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 150 + b"\r\n",
        b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n",
        b"GET " + p.encode() + b"\r\n\r\n",  # HTTP/0.9 style
        request(rng.choice(["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "PROPFIND", "BREW"]), p,
                auth, b'{"a": 1}'),
        request("HEAD", p, auth),
        request("POST", p, auth, b"x" * 100, content_length="-1"),
        request("POST", p, auth, b"x" * 100, content_length="abc"),
        request("POST", p, auth, b"x" * 10, content_length="99999999999999999999"),
        request("POST", p, {**auth, "Content-Length": "5"}, b"hello", content_length="7"),
        request("POST", p, {**auth, "Transfer-Encoding": "chunked"}, b"5\r\nhello\r\n0\r\n\r\n", content_length=None),
        request("POST", p, auth, b"", content_length=None),
        request("POST", p, auth, b"{" * 10, content_length="100"),  # short body, then EOF
        request("GET", p + "?" + "&".join(f"a{i}=b" for i in range(2000)), auth),
        request("GET", p, {"Authorization": "Bearer " + "x" * 60_000}),
        request("GET", p, {"Authorization": "Bearer \udcff\udcfe"}),
        request("POST", p, {"Content-Type": "application/json"}, deep(50_000)),
    ]


def smuggle_case(path: str, headers: dict[str, str] | None = None) -> bytes:
    """An early-answered POST whose body is itself a complete request: exactly one response may come back."""
    inner = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    return request("POST", path, headers or {}, inner)


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (/proc/<pid>/status VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0
