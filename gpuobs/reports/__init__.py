"""Reports without Grafana: self-contained HTML files with PNG plots drawn from Prometheus data.

* :func:`gpuobs.reports.drill.write_drill_report`: a failure drill's fault metrics with the
  alert's firing, paging and resolution marked (``gpuobs report drill <name>``).
* :func:`gpuobs.reports.rollout.write_rollout_report`: a rollout's canary against its
  baseline, distributions and over time with the stages marked (``gpuobs report rollout``).

Submodules: :mod:`~gpuobs.reports.html` (escaping page builder), :mod:`~gpuobs.reports.plots`
(matplotlib, Agg), :mod:`~gpuobs.reports.query` (Prometheus range queries), :mod:`~gpuobs.cli.report`.
The writers are imported lazily so ``import gpuobs.reports`` does not load matplotlib.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_drill_report", "write_rollout_report"]


def write_drill_report(result: dict, prometheus_url: str, out_dir: Path, **kwargs: Any) -> Path:
    """See :func:`gpuobs.reports.drill.write_drill_report`."""
    from gpuobs.reports.drill import write_drill_report as write

    return write(result, prometheus_url, out_dir, **kwargs)


def write_rollout_report(doc: dict, out_dir: Path, **kwargs: Any) -> Path:
    """See :func:`gpuobs.reports.rollout.write_rollout_report`."""
    from gpuobs.reports.rollout import write_rollout_report as write

    return write(doc, out_dir, **kwargs)
