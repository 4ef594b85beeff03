"""A headless Chromium driven over the Chrome DevTools Protocol, for tests that look at a page the way a
person does: its width, what is visible, typing and clicking, screenshots.

Debian's ``chromium`` with ``--remote-debugging-port`` on 127.0.0.1, spoken to with ``websocket-client``
(CDP domains Page, Runtime, Emulation; https://chromedevtools.github.io/devtools-protocol/). The
browser, its profile directory and its port are this test's alone and are gone when the context ends.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

from gpuobs.stack.ports import free_port_range

# CDP's answers to an evaluation while the page is navigating (chromium's
# "Inspected target navigated or closed", "Execution context was destroyed", "Cannot find context").
NAVIGATING = ("navigated or closed", "context was destroyed", "Cannot find context")


class CDPError(AssertionError):
    """A CDP command answered with an error (its method and the error object in the message)."""


class Browser:
    """One page in a fresh headless Chromium ``width`` x ``height`` CSS pixels (a context manager)."""

    def __init__(self, width: int = 1280, height: int = 900):
        self.width, self.height = width, height
        self._ids = itertools.count(1)

    def __enter__(self) -> "Browser":
        import websocket

        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if exe is None:
            pytest.fail("Debian's chromium is not installed: run `make binaries` as root (apt-get install chromium)")
        self._profile = tempfile.mkdtemp(prefix="gpuobs-chromium-")
        port = free_port_range(1)
        self._proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--remote-debugging-address=127.0.0.1",
             f"--remote-debugging-port={port}", f"--user-data-dir={self._profile}",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                pages = [t for t in requests.get(f"http://127.0.0.1:{port}/json/list", timeout=2).json()
                         if t.get("type") == "page"]
                if pages:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or self._proc.poll() is not None:
                self.__exit__(None, None, None)
                pytest.fail("headless chromium did not offer a page over the DevTools protocol within 30 s")
            time.sleep(0.2)
        self._ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30)
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)
        self.call("Page.enable")
        self.call("Runtime.enable")
        return self

    def __exit__(self, *exc) -> None:
        ws = getattr(self, "_ws", None)
        if ws is not None:
            ws.close()
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        shutil.rmtree(self._profile, ignore_errors=True)

    def call(self, method: str, **params):
        """Send one CDP command and return its ``result`` (events in between are skipped)."""
        mid = next(self._ids)
        self._ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expr: str):
        """The value of the JavaScript expression ``expr`` in the page (JSON-serialisable)."""
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expr}: {r['exceptionDetails'].get('text')} {r.get('result', {}).get('description', '')}")
        return r["result"].get("value")

    def open(self, url: str, ready: str = "document.readyState === 'complete'", timeout_s: float = 20) -> None:
        """Navigate to ``url`` and wait until ``ready`` (a JS expression) is true."""
        self.call("Page.navigate", url=url)
        self.wait(ready, timeout_s)

    def wait(self, cond: str, timeout_s: float = 20) -> None:
        """Poll ``cond`` (a JS expression) every 0.1 s until true; AssertionError after ``timeout_s``.

        A page in the middle of a navigation (a form submit, a link) answers an evaluation with
        "Inspected target navigated or closed" or "Execution context was destroyed"; those count as
        "not yet", any other CDP error is raised.
        """
        deadline = time.monotonic() + timeout_s
        while not self._eval_during_navigation(f"!!({cond})"):
            if time.monotonic() > deadline:
                raise AssertionError(f"page never satisfied {cond!r} within {timeout_s} s")
            time.sleep(0.1)

    def _eval_during_navigation(self, expr: str):
        try:
            return self.eval(expr)
        except CDPError as e:
            if any(m in str(e) for m in NAVIGATING):
                return False
            raise

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """A PNG of the page (the whole page, at the viewport's width) to ``path``."""
        params: dict = {"format": "png"}
        if full_page:
            h = int(self.eval("Math.ceil(document.documentElement.scrollHeight)"))
            params["clip"] = {"x": 0, "y": 0, "width": self.width, "height": max(h, 100), "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path
