"""Runbooks rendered to HTML: every alert's runbook_url lands on an existing anchor; links are links."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import requests

from gpuobs.pager import runbooks
from gpuobs.pager.server import PagerServer
from gpuobs.pager.store import PageStore
from tests.mixin.test_rules import all_rules

ROOT = Path(__file__).resolve().parents[2]


def test_every_alert_runbook_url_resolves_to_an_anchor_in_the_rendered_html():
    rendered: dict[str, set[str]] = {}
    alerts = [rule for _, rule in all_rules() if "alert" in rule]
    assert len(alerts) > 20
    for rule in alerts:
        url = rule["annotations"]["runbook_url"]
        file, anchor = url.split("/runbooks/", 1)[1].split("#", 1)
        if file not in rendered:
            rendered[file] = runbooks.anchors(runbooks.page(file, (ROOT / "runbooks" / file).read_text()))
        assert anchor in rendered[file], f"{rule['alert']}: {url} has no id={anchor!r} in the rendered runbooks/{file}"


def test_rendering_makes_links_clickable_escapes_html_and_slugs_like_github():
    body, heads = runbooks.render("# Top\n## GpuXidCritical\nsee [kv](kv-cache.md#kvcachepressure) <b>x</b>\n"
                                  "## One page per incident\n```\n# not a heading\n```\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert [a for _, a, _ in heads] == ["top", "gpuxidcritical", "one-page-per-incident"]
    assert '<a href="kv-cache.md#kvcachepressure">kv</a>' in body and "&lt;b&gt;" in body and "<table>" in body
    assert runbooks.github_slug("Paging codes (GpuXidCritical)") == "paging-codes-gpuxidcritical"


def test_every_relative_link_in_the_rendered_runbooks_resolves():
    docs = {p.name: runbooks.page(p.name, p.read_text()) for p in (ROOT / "runbooks").glob("*.md")}
    checked = 0
    for name, page in docs.items():
        for href in re.findall(r'<a href="([^"]+)"', page):
            if href.startswith(("http://", "https://", "/", "mailto:")) or "?" in href:
                continue
            file, _, anchor = href.partition("#")
            file = file or name
            if not file.endswith(".md") or "/" in file:
                continue  # docs outside runbooks/
            assert file in docs, f"runbooks/{name} links to missing {file}"
            checked += 1
            if anchor:
                assert anchor in runbooks.anchors(docs[file]), f"runbooks/{name}: {href} has no anchor"
    assert checked > 50  # the runbooks cross-link heavily; none found means the rendering lost them


def test_pager_serves_rendered_runbooks_with_an_index(tmp_path):
    store = PageStore(tmp_path / "p.sqlite")
    srv = PagerServer(("127.0.0.1", 0), store, ROOT / "runbooks")
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        r = requests.get(f"{url}/runbooks/xid.md", timeout=5)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
        assert '<h2 id="gpuxidcritical">GpuXidCritical</h2>' in r.text
        index = requests.get(f"{url}/runbooks/", timeout=5).text
        assert '<a href="/runbooks/xid.md">xid.md</a>' in index
        assert requests.get(f"{url}/runbooks/nope.md", timeout=5).status_code == 404
    finally:
        srv.shutdown()
        srv.server_close()
        store.close()
