"""Which Prometheus web UI paths the running build serves.

Upstream release binaries serve the React UI at ``/alerts``, ``/targets``, ``/graph``; Debian's
``prometheus`` package is built without the React assets and serves the classic UI under
``/classic/...`` (``/alerts`` answers 404 there). The stack probes and prints the paths that answer.
"""

from __future__ import annotations

import requests

PAGES = ("graph", "alerts", "targets", "rules")


def prometheus_pages(base_url: str, timeout_s: float = 3.0) -> dict[str, str]:
    """``{"alerts": "<base>/classic/alerts", ...}``: for each page, the first of ``/<page>`` and
    ``/classic/<page>`` that answers 200; a page neither answers is left out."""
    base = base_url.rstrip("/")
    out: dict[str, str] = {}
    for page in PAGES:
        for path in (f"/{page}", f"/classic/{page}"):
            try:
                if requests.get(base + path, timeout=timeout_s).status_code == 200:
                    out[page] = base + path
                    break
            except requests.RequestException:
                break  # Prometheus not answering: print the base URL only
    return out
