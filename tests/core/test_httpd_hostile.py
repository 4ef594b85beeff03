"""The shared HTTP base under hostile request lines (issue 12): no 5xx, a status line on every answer."""

from __future__ import annotations

import socket
import threading

import pytest

from gpuobs.core import httpd


class _Hello(httpd.Handler):
    methods = {"GET": "_get"}

    def _get(self) -> None:
        self.send_json(200, {"hello": "world"})


@pytest.fixture
def port():
    srv = httpd.Server(("127.0.0.1", 0), _Hello)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize("request_line, status", [
    (b"BREW / HTTP/1.1", b"405"),          # unknown method: 405 + Allow, not http.server's 501
    (b"PROPFIND / HTTP/1.1", b"405"),
    (b"G\x00ET / HTTP/1.1", b"400"),       # not a method token at all
    (b"GET / HTTP/2.0", b"400"),           # was 505
    (b"GET / HTTP/9.9", b"400"),
    (b"GET /", b"400"),                    # HTTP/0.9: was answered without a status line
    (b"GARBAGE", b"400"),
])
def test_hostile_request_lines_get_a_4xx_with_a_status_line(port, request_line, status):
    answer = _raw(port, request_line + b"\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.") and answer.split()[1] == status, answer[:200]
    if status == b"405":
        assert b"\r\nAllow: GET, HEAD\r\n" in answer


def test_a_good_request_still_works(port):
    answer = _raw(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"hello": "world"}\n')
