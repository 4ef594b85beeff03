"""Native-mode Grafana: started only when a Grafana binary is on PATH (docs/topology.md).

The repository's ``grafana/grafana.ini`` (outbound features off, anonymous read-only Viewer) and
provisioning files are the source of truth for both modes; for native mode the datasource URLs are
rewritten to the local ports, the dashboard provider points at the repository's
``grafana/dashboards``, and the admin password and secret key are generated into the run directory
(mode 0600) and passed through Grafana's ``GF_*`` environment overrides: there is no admin/admin.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import yaml

from gpuobs.core import assets
from gpuobs.core.files import atomic_write

#: Where distribution packages put Grafana's static files (``--homepath``), first match wins.
HOMEPATHS = ("/usr/share/grafana", "/usr/local/share/grafana", "/opt/grafana")


def find_grafana() -> list[str] | None:
    """argv prefix to run Grafana's server (``grafana server`` or ``grafana-server``), or None."""
    if shutil.which("grafana"):
        return [shutil.which("grafana"), "server"]
    if shutil.which("grafana-server"):
        return [shutil.which("grafana-server")]
    return None


def _secret(path: Path) -> str:
    if path.exists():
        return path.read_text().strip()
    value = secrets.token_urlsafe(24)
    atomic_write(path, value + "\n", 0o600)
    return value


def render(run: Path, port: int, prometheus: str, alertmanager: str, repo: Path | None = None) -> tuple[list[str], dict]:
    """Write ``run/grafana/provisioning`` and return (extra argv, environment) for the server.

    Raises FileNotFoundError if the repository's provisioning files are missing.
    """
    repo = repo or assets.root()
    out = run / "grafana"
    ds = yaml.safe_load((repo / "grafana/provisioning/datasources/datasources.yml").read_text())
    urls = {"prometheus": prometheus, "alertmanager": alertmanager}
    # Jaeger only exists in compose mode; keep the datasource (its uid is referenced) pointing nowhere useful.
    for d in ds["datasources"]:
        d["url"] = urls.get(d["uid"], d["url"])
    atomic_write(out / "provisioning/datasources/datasources.yml", yaml.safe_dump(ds, sort_keys=False))
    dash = yaml.safe_load((repo / "grafana/provisioning/dashboards/dashboards.yml").read_text())
    for p in dash["providers"]:
        p["options"]["path"] = str(repo / "grafana" / "dashboards")
    atomic_write(out / "provisioning/dashboards/dashboards.yml", yaml.safe_dump(dash, sort_keys=False))
    for sub in ("data", "logs", "plugins", "provisioning/plugins", "provisioning/alerting", "provisioning/notifiers"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    home = next((h for h in HOMEPATHS if Path(h).is_dir()), None)
    argv = ["--config", str(repo / "grafana" / "grafana.ini")] + (["--homepath", home] if home else [])
    env = dict(os.environ,
               GF_PATHS_DATA=str(out / "data"), GF_PATHS_LOGS=str(out / "logs"),
               GF_PATHS_PLUGINS=str(out / "plugins"), GF_PATHS_PROVISIONING=str(out / "provisioning"),
               GF_SERVER_HTTP_ADDR="127.0.0.1", GF_SERVER_HTTP_PORT=str(port),
               GF_SECURITY_ADMIN_PASSWORD=_secret(out / "admin-password"),
               GF_SECURITY_SECRET_KEY=_secret(out / "secret-key"))
    return argv, env
