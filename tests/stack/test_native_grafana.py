"""Native-mode Grafana rendering: local datasource URLs, repository dashboards, generated secrets."""

from __future__ import annotations

import stat

import yaml

from gpuobs.core.assets import checkout_root
from gpuobs.stack import grafana

REPO_ROOT = checkout_root()


def test_render_points_grafana_at_the_local_stack_with_generated_secrets(tmp_path):
    argv, env = grafana.render(tmp_path, 3300, "http://127.0.0.1:9190", "http://127.0.0.1:9193")
    ds = yaml.safe_load((tmp_path / "grafana/provisioning/datasources/datasources.yml").read_text())
    urls = {d["uid"]: d["url"] for d in ds["datasources"]}
    assert urls["prometheus"] == "http://127.0.0.1:9190" and urls["alertmanager"] == "http://127.0.0.1:9193"
    prov = yaml.safe_load((tmp_path / "grafana/provisioning/dashboards/dashboards.yml").read_text())
    assert prov["providers"][0]["options"]["path"] == str(REPO_ROOT / "grafana" / "dashboards")
    assert argv[:2] == ["--config", str(REPO_ROOT / "grafana" / "grafana.ini")]
    assert env["GF_SERVER_HTTP_ADDR"] == "127.0.0.1" and env["GF_SERVER_HTTP_PORT"] == "3300"
    pw = (tmp_path / "grafana/admin-password").read_text().strip()
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == pw and pw != "admin" and len(pw) >= 24
    assert stat.S_IMODE((tmp_path / "grafana/admin-password").stat().st_mode) == 0o600
    # A second render keeps the same secrets (restarts must not lock the admin out).
    _, env2 = grafana.render(tmp_path, 3300, "http://127.0.0.1:9190", "http://127.0.0.1:9193")
    assert env2["GF_SECURITY_ADMIN_PASSWORD"] == pw


def test_no_grafana_binary_means_not_started(monkeypatch):
    monkeypatch.setattr(grafana.shutil, "which", lambda name: None)
    assert grafana.find_grafana() is None
    monkeypatch.setattr(grafana.shutil, "which", lambda name: "/usr/sbin/grafana-server" if name == "grafana-server" else None)
    assert grafana.find_grafana() == ["/usr/sbin/grafana-server"]
