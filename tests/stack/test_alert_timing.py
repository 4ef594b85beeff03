"""The derived alert-delivery settings (gpuobs/stack/alert_timing.py) and where they are applied."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuobs.core import tokens
from gpuobs.core.durations import parse_duration
from gpuobs.stack import alert_timing
from gpuobs.stack.render import Ports, render_alertmanager

REPO = Path(__file__).resolve().parents[2]


def simulate_outage(t: alert_timing.AlertTiming, die_at: float, outage_s: float, restart_s: float,
                    first_send_dropped: bool = True) -> bool:
    """Replay Prometheus v2.42 sending (rules/alerting.go: resend when LastSentAt + r < ts, at evaluations
    only; ValidUntil = ts + 4 max(r, e)) around an outage; True if Alertmanager's alert never expires
    (its endsAt stays ahead of the next send) until the restarted Prometheus sends again. With
    ``first_send_dropped`` the restarted Prometheus's first send is lost (notifier/notifier.go: no
    Alertmanager discovered yet) and the one that counts comes a resend delay later."""
    e, r = t.evaluation_interval_s, t.resend_delay_s
    last_sent, ts, ends_at = None, 0.0, None
    while ts < die_at:
        if last_sent is None or last_sent + r < ts:
            last_sent, ends_at = ts, ts + 4 * max(r, e)
        ts += e
    resend_at = die_at + outage_s + restart_s  # first send of the restarted Prometheus
    if first_send_dropped:
        resend_at += r + e
    return ends_at > resend_at


def test_default_settings():
    d = alert_timing.DEFAULT
    assert d.resend_delay_s == 180 and d.for_grace_period_s == 5 and d.nflog_maintenance_s == 5
    assert d.resolve_timeout_s == d.validity_s == 720
    assert d.prometheus_flags() == ["--rules.alert.resend-delay=3m", "--rules.alert.for-grace-period=5s"]
    assert d.alertmanager_flags() == ["--data.maintenance-interval=5s"]
    assert d.tolerated_outage_s() >= 300


@pytest.mark.parametrize("outage", [60, 90, 180, 300])
def test_no_false_resolution_for_outages_up_to_five_minutes_at_any_phase(outage):
    d = alert_timing.DEFAULT
    for k in range(0, 400):  # Prometheus dies at every phase of the send cycle
        assert simulate_outage(d, 600 + k * 0.5, outage, alert_timing.RESTART_ALLOWANCE_S), (outage, k)


def test_the_old_15s_resend_delay_fails_and_the_derivation_is_minimal():
    old = alert_timing.AlertTiming(15, 600, 300, 900, 5)
    assert not simulate_outage(old, 600, 91, 10, False)  # the measured false resolution of a 91 s outage
    # One step (30 s) below the derived resend delay no longer covers 5 min at the worst phase.
    d = alert_timing.DEFAULT
    smaller = alert_timing.AlertTiming(d.resend_delay_s - alert_timing.RESEND_STEP_S, 5, 0, 5, 5)
    assert not all(simulate_outage(smaller, 600 + k * 0.5, 300, alert_timing.RESTART_ALLOWANCE_S) for k in range(400))


def test_derive_validates_and_scales():
    assert alert_timing.derive(max_outage_s=600).resend_delay_s == 330
    assert alert_timing.derive(max_outage_s=0, restart_s=0).resend_delay_s == alert_timing.RESEND_STEP_S
    for bad in ({"max_outage_s": -1}, {"max_outage_s": float("inf")}, {"evaluation_interval_s": 0}):
        with pytest.raises(ValueError):
            alert_timing.derive(**bad)


def test_compose_and_repo_configs_carry_the_derived_settings():
    d = alert_timing.DEFAULT
    compose = yaml.safe_load((REPO / "compose/docker-compose.yml").read_text())["services"]
    assert set(d.prometheus_flags()) <= set(compose["prometheus"]["command"])
    assert set(d.alertmanager_flags()) <= set(compose["alertmanager"]["command"])
    am = yaml.safe_load((REPO / "alertmanager/alertmanager.yml").read_text())
    assert parse_duration(am["global"]["resolve_timeout"]) == d.resolve_timeout_s
    prom = yaml.safe_load((REPO / "prometheus/prometheus.yml").read_text())
    assert parse_duration(prom["global"]["evaluation_interval"]) == d.evaluation_interval_s
    # Every rule with a `for` is restored after a restart (for >= the grace period).
    for f in (REPO / "prometheus/rules").glob("*.yml"):
        for g in yaml.safe_load(f.read_text())["groups"]:
            for rule in g["rules"]:
                if "for" in rule:
                    assert parse_duration(rule["for"]) >= d.for_grace_period_s, (f.name, rule.get("alert"))


def test_rendered_alertmanager_config_authenticates_to_the_pager(tmp_path):
    token_file = tmp_path / "pager-token"
    tokens.load_or_create(token_file)
    path = render_alertmanager(tmp_path, Ports(pager=19097), pager_token_file=token_file, resolve_timeout="8m")
    cfg = yaml.safe_load(path.read_text())
    hooks = [wh for r in cfg["receivers"] for wh in r.get("webhook_configs", [])]
    assert hooks and all(wh["url"].startswith("http://127.0.0.1:19097/hook/") for wh in hooks)
    assert all(wh["http_config"] == {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}}
               for wh in hooks)
    assert cfg["global"]["resolve_timeout"] == "8m"
