"""``gpuobs doctor``: read a live Prometheus-API backend and say, per alert family
(:mod:`gpuobs.mixin.families`), whether gpuobs's rules are live, degraded or blind there, why, and the
exact fix (counters-CSV lines, relabel snippets, selectors).

Where it stands against linters: cloudflare/pint's ``promql/series`` check and promcheck report that a
rule's series is missing, but know nothing of GPUs, of dcgm-exporter's versions and label quirks, or of a
stock path that still pages when the enhanced series is absent. Doctor judges families, not queries.

Layers: :mod:`.snapshot` reads (instant queries only), :mod:`.verdict` judges (pure), :mod:`.render`
prints; :func:`run` ties them together and is what the CLI and the tests call.
"""

from __future__ import annotations

from typing import Iterable

from gpuobs.core.errors import InputError
from gpuobs.core.fleet import FleetConfig, check_label_name
from gpuobs.doctor.snapshot import (
    Snapshot,
    collect,
    parse_selector,
)
from gpuobs.doctor.verdict import STATUSES, FamilyVerdict, Finding, Report, diagnose
from gpuobs.mixin.families import FAMILIES
from gpuobs.promapi.prometheus import PromClient

__all__ = ["run", "diagnose", "collect", "Report", "FamilyVerdict", "Finding", "Snapshot", "STATUSES", "parse_skip"]


def parse_skip(values: Iterable[str]) -> list[str]:
    """Family names from ``--skip`` values (repeatable, comma-separated). Raises InputError naming the
    allowed families for an unknown one."""
    known = [f.name for f in FAMILIES]
    out = []
    for v in values:
        for name in filter(None, (x.strip() for x in v.split(","))):
            if name not in known:
                raise InputError(f"--skip: unknown family {name!r}; allowed: {', '.join(known)}")
            out.append(name)
    return out


def run(url: str, fleet: FleetConfig | None = None, *, identity_label: str | None = None,
        dcgm_selector: str | None = None, vllm_selector: str | None = None, skip: Iterable[str] = (),
        timeout: float = 10.0, retries: int = 1, client: PromClient | None = None) -> Report:
    """Check the Prometheus at ``url`` and return the :class:`Report` (``report.exit_code``: 1 when a paging
    family is blind, else 0).

    ``fleet``: the fleet config the rules were rendered from (default: the default fleet config), whose
    identity label and selectors are checked; ``identity_label``, ``dcgm_selector``, ``vllm_selector``
    override them (the CLI's flags).

    Raises :class:`InputError` (exit 2) for a bad URL, selector, label name or family, and the
    :class:`gpuobs.promapi.prometheus.PrometheusError` subclasses when Prometheus cannot be reached
    (exit 1) or rejects a query (exit 2)."""
    fleet = fleet or FleetConfig()
    ident = check_label_name(fleet.identity_label if identity_label is None else identity_label, "--identity-label")
    dcgm = parse_selector(fleet.dcgm_selector if dcgm_selector is None else dcgm_selector, "--dcgm-selector")
    vllm = parse_selector(fleet.vllm_selector if vllm_selector is None else vllm_selector, "--vllm-selector")
    skipped = parse_skip(skip)
    if client is None:
        try:
            client = PromClient(url, timeout=timeout, retries=retries)
        except ValueError as exc:
            raise InputError(f"--prometheus: {exc}") from None
    snap = collect(client, ident, dcgm, vllm)
    return diagnose(snap, skip=skipped)
