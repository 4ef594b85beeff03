"""Postmortem drafts: template structure, measured times, timeline, plots of the alert's own expression."""

from __future__ import annotations

from gpuobs.cli import run as cli_run
from gpuobs.pager import postmortem
from gpuobs.pager.store import PageStore
from gpuobs.stack.ports import free_port_range
from tests.fakes.prometheus import FakePrometheus, matrix, ok
from tests.pager.test_incidents import XID, _payload
from tests.pager.test_pager import AUTH, pager  # noqa: F401 (the pager server fixture)

import requests

T_START = 1_796_000_000.0  # 2026-11-30T05:00:00Z is the alerts' startsAt in the payloads
EXPR = "DCGM_FI_DEV_XID_ERRORS > 0"


def _incident(tmp_path) -> dict:
    store = PageStore(tmp_path / "p.sqlite")
    start = postmortem._rfc3339("2026-11-30T05:00:00Z")
    store.add("page", _payload(), received_at=start + 42)
    store.acknowledge(1, "alice", at=start + 100)
    store.add("page", _payload("resolved"), received_at=start + 700)
    inc = store.incident(1)
    store.close()
    return inc


def _prom(start: float):
    def respond(endpoint, params):
        if endpoint == "rules":
            return ok({"groups": [{"name": "xid", "rules": [{"type": "alerting", "name": "GpuXidCritical",
                                                             "query": EXPR}]}]})
        if endpoint == "query_range":
            assert params["query"] == [EXPR]
            pts = [(start - 600 + 15 * i, 48.0 if 0 <= i * 15 - 600 <= 700 else 0.0) for i in range(90)]
            return ok(matrix([({"Hostname": "gpu-node-01", "gpu": "3", "xid": "48"}, pts),
                              ({"Hostname": "gpu-node-09", "gpu": "0", "xid": "48"}, pts)]))  # another node: left out
        return 404, {"status": "error"}
    return FakePrometheus(respond)


def test_draft_has_template_sections_times_timeline_and_a_plot(tmp_path):
    inc = _incident(tmp_path)
    start = postmortem._rfc3339("2026-11-30T05:00:00Z")
    m = postmortem.measures(inc)
    assert (m["detect"], m["ack"], m["resolve"], m["duration"]) == (42.0, 58.0, 658.0, 700.0)
    with _prom(start) as fp:
        md_path, html_path, note = postmortem.write(inc, tmp_path / "pm", fp.url, now=start + 3600)
    assert note is None
    md = md_path.read_text()
    for section in ("## Summary", "## Impact", "## Timeline (UTC)", "## Detection and response",
                    "## Contributing causes", "## Action items"):
        assert section in md
    assert "| Time to page (first firing -> first notification) | 0m 42s |" in md
    assert "| Time to acknowledge (opened -> acknowledged) | 0m 58s |" in md
    assert "| Time to resolve (opened -> resolved) | 10m 58s |" in md
    assert "| 2026-11-30 05:00:00 | Prometheus | GpuXidCritical started firing (Hostname=gpu-node-01, gpu=3, xid=48) |" in md
    assert "| 2026-11-30 05:01:40 | pager | acknowledged by alice |" in md
    assert "GPU 3 (PCI 00000000:18:00.0) on gpu-node-01 reported Xid 48" in md
    assert "![GpuXidCritical](postmortem-incident-1-GpuXidCritical.png)" in md
    png = tmp_path / "pm" / "postmortem-incident-1-GpuXidCritical.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    html = html_path.read_text()
    assert 'src="data:image/png;base64,' in html and "<table>" in html


def test_without_prometheus_the_draft_says_so(tmp_path):
    inc = _incident(tmp_path)
    dead = f"http://127.0.0.1:{free_port_range(1)}"
    md_path, _, note = postmortem.write(inc, tmp_path / "pm", dead, now=T_START)
    assert note and "cannot reach Prometheus" in note and "_Not all metrics could be plotted" in md_path.read_text()


def test_cli_postmortem(pager, tmp_path, capsys):  # noqa: F811
    url, _, _ = pager
    requests.post(f"{url}/hook/page", json=XID, headers=AUTH, timeout=5)
    dead = f"http://127.0.0.1:{free_port_range(1)}"
    assert cli_run(["incident", "postmortem", "1", "--pager-url", url, "--prometheus", dead,
                    "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "postmortem-incident-1.md" in out and "note: cannot reach Prometheus" in out
    assert (tmp_path / "out" / "postmortem-incident-1.html").is_file()


def test_the_timeline_is_one_table_in_time_order_and_names_the_node_by_the_fleet_identity(tmp_path):
    """Issue 29: the alerts' start rows came first whatever their time (02:58:01 before 02:52:28); the node
    was named only by dcgm-exporter's Hostname."""
    store = PageStore(tmp_path / "p.sqlite")
    start = postmortem._rfc3339("2026-11-30T05:00:00Z")
    store.add("page", _payload(), received_at=start + 42)
    store.acknowledge(1, "alice", at=start + 100)
    late = _payload()
    late["alerts"][0] = {**late["alerts"][0], "fingerprint": "late", "startsAt": "2026-11-30T05:05:00Z",
                         "labels": {"alertname": "GpuEccDoubleBitError", "node": "gpu-node-01", "gpu": "3",
                                    "severity": "critical"}}
    store.add("page", late, received_at=start + 310)
    inc = store.incident(1)
    store.close()
    md = postmortem.markdown_draft(inc, [], None)
    rows = [line for line in md.splitlines() if line.startswith("| 2026-11-30")]
    assert rows == sorted(rows), rows
    assert any("GpuEccDoubleBitError started firing (gpu=3, node=gpu-node-01)" in r for r in rows), rows
    assert rows.index(next(r for r in rows if "acknowledged by alice" in r)) < rows.index(
        next(r for r in rows if "GpuEccDoubleBitError started firing" in r))


def test_the_draft_carries_the_measured_impact_and_its_promql(tmp_path):
    from gpuobs.pager import impact
    from tests.pager.test_impact import CFG, T0, StubProm, incident as impact_incident, serving_series

    inc = _incident(tmp_path)
    assert "_Not measured. Fill from the SLO queries" in postmortem.markdown_draft(inc, [], None)
    inc["impact"] = impact.measure(StubProm(serving_series(0.21, 0.5), [{"node": "gpu-node-00", "gpu": "0"}], 32),
                                   CFG, impact_incident(T0, T0 + 300), now=T0 + 400)
    md = postmortem.markdown_draft(inc, [], None)
    section = md.split("## Impact", 1)[1].split("## Timeline", 1)[0]
    assert inc["impact"]["line"] in section
    assert "| llama on 127.0.0.1:8000 | 3000 | 630 (600) | 1500 (1500) | 2100 requests (7.0 req/s) |" in section
    assert "Capacity out: 1 of 32 GPUs." in section
    assert '- failed: `sum(increase(vllm:request_success_total{job=~"vllm|.*vllm.*", node=~"gpu-node-00", ' \
           'finished_reason="error"}[300s]))`' in section, section
