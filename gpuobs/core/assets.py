"""Where gpuobs finds the files it ships besides code: Prometheus config and rules, the SLO file,
Alertmanager config, runbooks and Grafana dashboards/provisioning.

In a checkout these are the repository's top-level folders (the source of truth; compose and a real
fleet use them as they are). An installed wheel carries copies under ``gpuobs/_assets/`` (written by
``setup.py``'s build step), so ``pip install gpuobs`` on a Prometheus host works without a checkout.
``GPUOBS_ASSETS`` overrides both.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuobs.core.errors import Failure

#: Paths (relative to the asset root) that a wheel carries; setup.py copies exactly these.
SHIPPED = ("prometheus/prometheus.yml", "prometheus/slo.yaml", "prometheus/fleet.yaml", "prometheus/rules",
           "alertmanager", "runbooks", "grafana/dashboards", "grafana/provisioning", "grafana/grafana.ini",
           "deploy/dcgm-exporter")

_PACKAGE = Path(__file__).resolve().parents[1]


def checkout_root() -> Path | None:
    """The repository root when gpuobs runs from a checkout (editable install), else None."""
    root = _PACKAGE.parent
    if (root / "pyproject.toml").is_file() and (root / "prometheus" / "prometheus.yml").is_file():
        return root
    return None


def root() -> Path:
    """The asset root: ``$GPUOBS_ASSETS``, else the checkout, else the packaged copy.

    Raises :class:`gpuobs.core.errors.Failure` when none exists (a broken install)."""
    env = os.environ.get("GPUOBS_ASSETS")
    if env:
        return Path(env).resolve()
    found = checkout_root()
    if found is not None:
        return found
    packaged = _PACKAGE / "_assets"
    if (packaged / "prometheus" / "prometheus.yml").is_file():
        return packaged
    raise Failure("gpuobs cannot find its rule files: no checkout around the package and no packaged "
                  "gpuobs/_assets (reinstall the wheel, or set GPUOBS_ASSETS to a gpuobs checkout)")


def path(relative: str) -> Path:
    """``root() / relative``."""
    return root() / relative
