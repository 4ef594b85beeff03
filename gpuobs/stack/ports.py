"""Loopback port helpers shared by the supervisor, the tests and the benchmarks."""

from __future__ import annotations

import os
import socket


def port_free(port: int) -> bool:
    """True if nothing listens on 127.0.0.1:port (a bind succeeds)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_range(count: int, start: int = 12000, stop: int = 32700) -> int:
    """First p >= start (offset by the pid, so parallel runs spread out) such that p..p+count-1 are
    all free on 127.0.0.1. The range stays below Linux's ephemeral ports (32768+), so our own client
    connections cannot take a chosen port before the server binds it. RuntimeError if none is free."""
    for p in range(start + (os.getpid() * 97) % 4000, stop - count, count):
        socks = []
        try:
            for q in range(p, p + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")
