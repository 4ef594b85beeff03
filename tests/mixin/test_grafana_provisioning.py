"""Offline checks of Grafana's provisioning and settings (grafana/), as the compose stack mounts them.

No Grafana is needed: the datasource and dashboard-provider files, grafana.ini and the compose service
are read as data and checked against what Grafana would do with them.
"""

from __future__ import annotations

import configparser
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
COMPOSE_FILE = ROOT / "compose" / "docker-compose.yml"
EXPECTED_UIDS = {"prometheus", "alertmanager", "jaeger"}


@pytest.fixture(scope="module")
def compose_services() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())["services"]


@pytest.fixture(scope="module")
def grafana_svc(compose_services) -> dict:
    return compose_services["grafana"]


@pytest.fixture(scope="module")
def datasources() -> list[dict]:
    doc = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "datasources.yml").read_text())
    assert doc["apiVersion"] == 1
    return doc["datasources"]


@pytest.fixture(scope="module")
def ini() -> configparser.ConfigParser:
    # Grafana's ini has no interpolation of the Python kind ($__file{} is Grafana's own), and its keys
    # are case-sensitive (feature toggle names).
    cp = configparser.ConfigParser(interpolation=None, strict=True)
    cp.optionxform = str  # type: ignore[assignment]
    cp.read_string((GRAFANA / "grafana.ini").read_text())
    return cp


def binds(svc: dict) -> dict[str, str]:
    """{container target: host source} of the service's bind mounts (short syntax)."""
    out = {}
    for v in svc.get("volumes", []):
        src, dst = v.split(":")[:2]
        if src.startswith((".", "/")):
            out[dst] = src
    return out


# ---- datasources --------------------------------------------------------------------------------------
def test_datasource_uids_are_fixed_and_unique(datasources):
    uids = [ds.get("uid") for ds in datasources]
    assert all(uids), "every datasource needs an explicit uid (dashboards refer to it)"
    assert len(uids) == len(set(uids))
    assert set(uids) == EXPECTED_UIDS
    by_uid = {ds["uid"]: ds for ds in datasources}
    assert by_uid["prometheus"]["type"] == "prometheus"
    assert by_uid["alertmanager"]["type"] == "alertmanager"
    assert by_uid["alertmanager"]["jsonData"]["implementation"] == "prometheus"
    assert by_uid["jaeger"]["type"] == "jaeger"
    assert [ds["uid"] for ds in datasources if ds.get("isDefault")] == ["prometheus"]
    assert all(ds.get("editable") is False for ds in datasources)


def test_datasource_urls_reach_the_compose_services(datasources, compose_services):
    """Each URL names a service on Grafana's backend network and the port that service listens on."""
    by_uid = {ds["uid"]: ds["url"] for ds in datasources}
    assert by_uid == {"prometheus": "http://prometheus:9090", "alertmanager": "http://pager:9093",
                      "jaeger": "http://jaeger:16686"}
    assert "--web.listen-address=:9090" in compose_services["prometheus"]["command"]
    # Alertmanager lives in the pager's network namespace, so its address is the pager's name.
    assert compose_services["alertmanager"]["network_mode"] == "service:pager"
    assert "--web.listen-address=:9093" in compose_services["alertmanager"]["command"]
    assert any(p.endswith(":16686") for p in compose_services["jaeger"]["ports"])
    for host in ("prometheus", "pager", "jaeger"):
        assert "backend" in compose_services[host]["networks"]
    assert "backend" in compose_services["grafana"]["networks"]


# ---- dashboards provider --------------------------------------------------------------------------------
def test_dashboard_provider_reads_the_compose_mount_of_the_repositorys_dashboards(grafana_svc):
    doc = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "dashboards.yml").read_text())
    assert doc["apiVersion"] == 1
    (provider,) = doc["providers"]
    assert provider["type"] == "file"
    assert provider["allowUiUpdates"] is False and provider["disableDeletion"] is True
    mounts = binds(grafana_svc)
    assert mounts[provider["options"]["path"]] == "../grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "../grafana/provisioning"
    assert mounts["/etc/grafana/grafana.ini"] == "../grafana/grafana.ini"
    assert (GRAFANA / "dashboards").is_dir()


def test_dashboards_only_use_provisioned_datasource_uids():
    """Any dashboard added later must point at a provisioned uid (or a template variable)."""
    def uids(node):
        if isinstance(node, dict):
            ds = node.get("datasource")
            if isinstance(ds, dict) and isinstance(ds.get("uid"), str):
                yield ds["uid"]
            for v in node.values():
                yield from uids(v)
        elif isinstance(node, list):
            for v in node:
                yield from uids(v)

    for path in sorted((GRAFANA / "dashboards").glob("*.json")):
        for uid in uids(json.loads(path.read_text())):
            assert uid in EXPECTED_UIDS or uid.startswith("$") or uid in ("-- Grafana --", "grafana"), \
                f"{path.name}: datasource uid {uid!r} is not provisioned"


# ---- outbound features off -------------------------------------------------------------------------------
OUTBOUND_OFF = {
    ("analytics", "reporting_enabled"): "false",
    ("analytics", "check_for_updates"): "false",
    ("analytics", "check_for_plugin_updates"): "false",
    ("analytics", "feedback_links_enabled"): "false",
    ("security", "disable_gravatar"): "true",
    ("news", "news_feed_enabled"): "false",
    ("snapshots", "external_enabled"): "false",
    ("plugins", "preinstall_disabled"): "true",
    ("plugins", "public_key_retrieval_disabled"): "true",
    ("plugins", "plugin_admin_enabled"): "false",
    ("feature_toggles", "pluginsDynamicAngularDetectionPatterns"): "false",
}


@pytest.mark.parametrize(("section", "key"), sorted(OUTBOUND_OFF))
def test_outbound_feature_is_disabled(ini, section, key):
    assert ini.get(section, key) == OUTBOUND_OFF[(section, key)]


def test_no_environment_override_re_enables_anything(grafana_svc):
    """GF_<SECTION>_<KEY> variables beat grafana.ini; none may touch the settings above."""
    env = grafana_svc.get("environment") or {}
    names = env if isinstance(env, dict) else [e.split("=", 1)[0] for e in env]
    for section, key in list(OUTBOUND_OFF) + [("security", "admin_password"), ("auth.anonymous", "org_role")]:
        var = f"GF_{section}_{key}".upper().replace(".", "_")
        assert var not in names and var + "__FILE" not in names


# ---- no admin/admin --------------------------------------------------------------------------------------------
def test_anonymous_access_is_read_only_viewer(ini):
    assert ini.get("auth.anonymous", "enabled") == "true"
    assert ini.get("auth.anonymous", "org_role") == "Viewer"
    assert ini.get("users", "allow_sign_up") == "false"


def test_admin_password_and_secret_key_are_generated_files(ini, grafana_svc):
    script = "\n".join(grafana_svc["entrypoint"])
    secrets_dir = re.search(r"d=(\S+)", script).group(1)
    for key, filename in (("admin_password", "admin-password"), ("secret_key", "secret-key")):
        value = ini.get("security", key)
        assert value == f"$__file{{{secrets_dir}/{filename}}}", f"[security] {key} = {value!r}"
    # The entrypoint writes both files when absent (from /dev/urandom, owner-only) and then starts
    # Grafana's own entrypoint; the directory is on the persistent data volume.
    assert "for f in admin-password secret-key" in script and "/dev/urandom" in script
    assert "umask 077" in script and script.rstrip().endswith("exec /run.sh")
    assert "grafana-data:/var/lib/grafana" in grafana_svc["volumes"]
    assert secrets_dir.startswith("/var/lib/grafana/")


def test_no_admin_admin_anywhere():
    """No default admin/admin credentials in any setting (comments, which may name it, are skipped)."""
    pattern = re.compile(r"admin\s*[/:]\s*admin\b|admin_password\s*[=:]\s*[\"']?admin\b|"
                         r"GF_SECURITY_ADMIN_PASSWORD\s*[=:]", re.IGNORECASE)
    checked = 0
    for base in (GRAFANA, ROOT / "compose"):
        for path in base.rglob("*"):
            if path.is_file() and path.suffix in (".ini", ".yml", ".yaml", ".json", ".md", ""):
                if path.name == "compose-spec.json":
                    continue
                checked += 1
                for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if line.strip().startswith(("#", ";")):
                        continue
                    hit = pattern.search(line)
                    assert not hit, f"{path.relative_to(ROOT)}:{n}: {hit.group(0)!r}"
    assert checked >= 6
