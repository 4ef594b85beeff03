"""Hidden behaviour of each release in the simulator: what a version does to latency, errors and memory.

Release tooling (compat, canary, rollout) never imports this module: the canary must find a regression
from metrics alone. Profiles come from the packaged ``data/behaviour.yaml`` (``profiles: {version:
{...}}``) or, for a custom catalogue passed with ``gpuobs exporter --releases FILE``, from that file's
``profile`` key per release; a version without one behaves like the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

import yaml

from gpuobs.reference.releases import Catalogue, CatalogueError, Release
from gpuobs.reference.releases import load as load_catalogue

FIELDS = "ttft_multiplier, itl_multiplier, error_rate_delta, leak_mib_per_min"


@dataclass(frozen=True)
class Profile:
    """Hidden behaviour of a release: TTFT/ITL multipliers, added error ratio, allocator leak MiB/min."""

    ttft_multiplier: float = 1.0
    itl_multiplier: float = 1.0
    error_rate_delta: float = 0.0
    leak_mib_per_min: float = 0.0


def _profile(version: str, spec: object) -> Profile:
    if spec is None:
        return Profile()
    if not isinstance(spec, dict) or set(spec) - {f.name for f in fields(Profile)}:
        raise CatalogueError(f"release {version}: bad profile {spec!r}; fields: {FIELDS}")
    try:
        return Profile(**{k: float(v) for k, v in spec.items()})
    except (TypeError, ValueError) as exc:
        raise CatalogueError(f"release {version}: bad profile ({exc}); fields: {FIELDS}") from None


@dataclass(frozen=True)
class SimCatalogue:
    """The release catalogue plus each version's hidden profile."""

    catalogue: Catalogue
    profiles: dict[str, Profile]

    @property
    def default(self) -> str:
        return self.catalogue.default

    @property
    def releases(self) -> dict[str, Release]:
        return self.catalogue.releases

    def get(self, version: str) -> Release:
        """The release named ``version``; KeyError listing the known versions otherwise."""
        return self.catalogue.get(version)

    def profile(self, version: str) -> Profile:
        """The hidden profile of ``version`` (baseline behaviour if it has none)."""
        return self.profiles.get(version, Profile())


def load(path: Path | None = None) -> SimCatalogue:
    """The catalogue at ``path`` (default: packaged) with profiles from it or the packaged behaviour file.

    Raises CatalogueError naming the version and field."""
    catalogue = load_catalogue(path)
    if path is None:
        doc = yaml.safe_load(resources.files("gpuobs.exporter.sim").joinpath("data/behaviour.yaml").read_text())
        specs = (doc or {}).get("profiles") or {}
    else:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))  # already parsed once: cannot fail here
        specs = {str(v): (s or {}).get("profile") for v, s in doc["releases"].items() if isinstance(s, dict)}
    return SimCatalogue(catalogue, {str(v): _profile(str(v), s) for v, s in specs.items() if str(v) in catalogue.releases})
