"""Build hook: a wheel carries the repository's rules, Alertmanager config, runbooks and dashboards as
package data under gpuobs/_assets (see gpuobs/core/assets.py), so an installed gpuobs works outside a
checkout. Editable installs read the checkout directly and copy nothing. All metadata is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SHIPPED = ("prometheus/prometheus.yml", "prometheus/slo.yaml", "prometheus/fleet.yaml", "prometheus/rules",
           "alertmanager", "runbooks", "grafana/dashboards", "grafana/provisioning", "grafana/grafana.ini",
           "deploy/dcgm-exporter")


class BuildWithAssets(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "gpuobs" / "_assets"
        for rel in SHIPPED:
            src = HERE / rel
            if src.is_dir():
                shutil.copytree(src, dest / rel, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)


setup(cmdclass={"build_py": BuildWithAssets})
