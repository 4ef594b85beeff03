"""Escalation: an unacknowledged open page escalates once per opening after N minutes (explicit clock)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from gpuobs.cli import run as cli_run
from gpuobs.pager.escalation import EscalationConfigError, Escalator, Policy, parse
from gpuobs.pager.store import PageStore
from gpuobs.stack.ports import free_port_range
from tests.pager.test_incidents import _payload, _ticket

T0 = 1_800_000_000.0


@pytest.fixture
def store(tmp_path):
    s = PageStore(tmp_path / "p.sqlite")
    yield s
    s.close()


def kinds(store, iid):
    return [e["kind"] for e in store.incident(iid)["timeline"]]


def test_unacknowledged_page_escalates_once_after_the_delay_and_not_tickets(store):
    esc = Escalator(store, Policy(900.0, "secondary"))
    store.add("page", _payload(), received_at=T0)
    store.add("ticket", _ticket(), received_at=T0)
    assert esc.check(T0 + 899) == []
    assert esc.check(T0 + 900) == [1]
    assert esc.check(T0 + 2000) == []  # once per opening
    ev = store.incident(1)["timeline"][-1]
    assert (ev["kind"], ev["receiver"], ev["after_s"], ev["at"]) == ("escalated", "secondary", 900.0, T0 + 900)
    assert "escalated" not in kinds(store, 2)  # tickets do not escalate by default
    # Resolved, then fires again: a new opening, the clock starts afresh.
    store.add("page", _payload("resolved"), received_at=T0 + 2100)
    store.add("page", _payload(starts="2026-11-30T06:00:00Z"), received_at=T0 + 3000)
    assert esc.check(T0 + 3899) == [] and esc.check(T0 + 3900) == [1]


def test_acknowledged_page_does_not_escalate(store):
    esc = Escalator(store, Policy(60.0, "secondary"))
    store.add("page", _payload(), received_at=T0)
    store.acknowledge(1, "alice", at=T0 + 30)
    assert esc.check(T0 + 600) == [] and "escalated" not in kinds(store, 1)


def test_webhook_receives_the_escalation_and_a_dead_one_is_recorded(store):
    got = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            import json
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        store.add("page", _payload(), received_at=T0)
        url = f"http://127.0.0.1:{srv.server_address[1]}/escalate"
        Escalator(store, Policy(60.0, "secondary", webhook_url=url)).check(T0 + 60)
        assert got and got[0]["receiver"] == "secondary" and got[0]["incident"]["id"] == 1
        assert store.incident(1)["timeline"][-1]["delivered"] is True
    finally:
        srv.shutdown()
        srv.server_close()
    store.add("ticket", _ticket(), received_at=T0)
    dead = f"http://127.0.0.1:{free_port_range(1)}/x"
    Escalator(store, Policy(60.0, "sec", ("ticket",), dead)).check(T0 + 60)
    ev = store.incident(2)["timeline"][-1]
    assert ev["kind"] == "escalated" and ev["delivered"] is False and ev["error"]


@pytest.mark.parametrize("doc, fragment", [
    ({}, "key 'escalation'"),
    ({"escalation": {"after": "soon", "receiver": "x"}}, "escalation.after"),
    ({"escalation": {"after": "5m", "receiver": ""}}, "escalation.receiver"),
    ({"escalation": {"after": "5m", "receiver": "x", "channels": ["sms"]}}, "escalation.channels"),
    ({"escalation": {"after": "5m", "receiver": "x", "webhook_url": "ftp://a"}}, "escalation.webhook_url"),
    ({"escalation": {"after": "5m", "receiver": "x", "colour": 1}}, "escalation.colour"),
])
def test_bad_config_names_the_field(doc, fragment):
    with pytest.raises(EscalationConfigError) as ei:
        parse(doc)
    assert fragment in str(ei.value)


def test_good_config_and_cli_rejects_a_bad_file(tmp_path, capsys):
    assert parse({"escalation": {"after": "15m", "receiver": "secondary"}}) == Policy(900.0, "secondary", ("page",), None)
    bad = tmp_path / "esc.yml"
    bad.write_text("escalation: {after: 0s, receiver: x}\n")
    assert cli_run(["pager", "--no-auth", "--db", str(tmp_path / "p.sqlite"), "--escalation-config", str(bad)]) == 2
    assert "--escalation-config" in capsys.readouterr().err
