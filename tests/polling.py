"""Waiting for a condition in live and fault tests: poll with a deadline, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import requests

T = TypeVar("T")

#: Errors a check may raise while the thing it watches is starting, stopping or restarting.
TRANSIENT: tuple[type[BaseException], ...] = (requests.RequestException, OSError, KeyError, ValueError)


def poll(what: str, check: Callable[[], T], timeout_s: float, every_s: float = 0.5,
         transient: tuple[type[BaseException], ...] = TRANSIENT) -> T:
    """Call ``check`` every ``every_s`` seconds until it returns something truthy, and return that.

    An exception in ``transient`` counts as "not yet". After ``timeout_s`` seconds raises
    TimeoutError naming ``what`` (fault tests catch it to report the incident that failed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value: Any = check()
        except transient:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(every_s)
