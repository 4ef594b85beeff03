"""The shared HTTP base: exact Content-Length, HEAD, 405 + Allow, body rules, no desync, 500 not a crash."""

from __future__ import annotations

import socket
import threading

import pytest

from gpuobs.core import httpd


class _Handler(httpd.Handler):
    max_body_bytes = 100
    methods = {"GET": "_get", "POST": "_post"}

    def _get(self) -> None:
        if self.path == "/boom":
            raise RuntimeError("bug")
        self.send_json(200, {"path": self.path})

    def _post(self) -> None:
        if self.path == "/early":  # answers before reading the body
            self.discard_body()
            self.send_error_json(401, "no")
            return
        doc = self.read_json()
        if doc is httpd.INVALID:
            return
        self.send_json(200, {"got": doc})


@pytest.fixture
def server():
    srv = httpd.Server(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def raw(port: int, data: bytes) -> bytes:
    """Send ``data`` on one connection and read until the server closes it or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        s.settimeout(1.0)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out


def test_get_and_head_have_the_same_length_and_head_no_body(server):
    get = raw(server, b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    head = raw(server, b"HEAD /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert get.startswith(b"HTTP/1.1 200") and head.startswith(b"HTTP/1.1 200")
    length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0]
    assert length in get and head.endswith(b"\r\n\r\n")


def test_unsupported_method_is_405_with_allow(server):
    r = raw(server, b"DELETE /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert r.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD, POST" in r


def test_body_rules_411_413_400(server):
    assert raw(server, b"POST /x HTTP/1.1\r\nHost: a\r\n\r\n").startswith(b"HTTP/1.1 411")
    assert raw(server, b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n").startswith(b"HTTP/1.1 413")
    assert raw(server, b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nConnection: close\r\n\r\n{x}").startswith(
        b"HTTP/1.1 400")
    deep = b"[" * 50 + b"]" * 50
    ok = raw(server, b"POST /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(deep), deep))
    assert ok.startswith(b"HTTP/1.1 200")


def test_an_early_answer_never_parses_the_body_as_the_next_request(server):
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
    r = raw(server, b"POST /early HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s" % (len(smuggled), smuggled))
    assert r.startswith(b"HTTP/1.1 401") and b"/smuggled" not in r


def test_a_handler_exception_is_a_500_and_the_server_lives(server):
    assert raw(server, b"GET /boom HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 500")
    assert raw(server, b"GET /ok HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 200")
