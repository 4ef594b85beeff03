"""Hidden behaviour of each release in the simulator: what a version does to latency, errors and memory.

Release tooling (compat, canary, rollout) never imports this module: the canary must find a regression
from metrics alone. Profiles come from the packaged ``data/behaviour.yaml`` (``profiles: {version:
{...}}``) or, for a custom catalogue passed with ``gpuobs exporter --releases FILE``, from that file's
``profile`` key per release; a version without one behaves like the baseline.

Feature flags have profiles too (``flag_profiles: {flag: {...}}`` in the packaged file, or a custom
catalogue's ``profile`` key per flag): what a flag does while it is on. A node's effective profile is
:func:`combine` of its release's and those of its flags that are on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path

import yaml

from gpuobs.reference.releases import Catalogue, CatalogueError, Release
from gpuobs.reference.releases import load as load_catalogue

FIELDS = ("ttft_multiplier, itl_multiplier, error_rate_delta, leak_mib_per_min, long_prompt_error_delta, "
          "long_prompt_tokens")


@dataclass(frozen=True)
class Profile:
    """Hidden behaviour of a release or flag: TTFT/ITL multipliers, added error ratio, allocator leak
    MiB/min, and an error ratio added only to requests whose prompt is longer than
    ``long_prompt_tokens`` (0: no such effect)."""

    ttft_multiplier: float = 1.0
    itl_multiplier: float = 1.0
    error_rate_delta: float = 0.0
    leak_mib_per_min: float = 0.0
    long_prompt_error_delta: float = 0.0
    long_prompt_tokens: float = 0.0


def combine(*profiles: Profile) -> Profile:
    """One profile acting as all of ``profiles`` at once: multipliers multiply, deltas and leaks add.

    Long-prompt effects: deltas add and the shortest threshold among the profiles that have one
    applies (an approximation when two flags name different thresholds; the catalogue has one)."""
    out = Profile()
    for p in profiles:
        long = [x for x in (out, p) if x.long_prompt_error_delta]
        out = Profile(out.ttft_multiplier * p.ttft_multiplier, out.itl_multiplier * p.itl_multiplier,
                      out.error_rate_delta + p.error_rate_delta, out.leak_mib_per_min + p.leak_mib_per_min,
                      out.long_prompt_error_delta + p.long_prompt_error_delta,
                      min((x.long_prompt_tokens for x in long), default=0.0))
    return out


def _profile(version: str, spec: object) -> Profile:
    if spec is None:
        return Profile()
    if not isinstance(spec, dict) or set(spec) - {f.name for f in fields(Profile)}:
        raise CatalogueError(f"{version}: bad profile {spec!r}; fields: {FIELDS}")
    try:
        return Profile(**{k: float(v) for k, v in spec.items()})
    except (TypeError, ValueError) as exc:
        raise CatalogueError(f"{version}: bad profile ({exc}); fields: {FIELDS}") from None


@dataclass(frozen=True)
class SimCatalogue:
    """The release catalogue plus each version's and each flag's hidden profile."""

    catalogue: Catalogue
    profiles: dict[str, Profile]
    flag_profiles: dict[str, Profile] = field(default_factory=dict)

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

    @property
    def flags(self) -> dict:
        """The catalogue's feature flags (:class:`~gpuobs.reference.releases.Flag` by key)."""
        return self.catalogue.flags

    def flag_profile(self, flag: str) -> Profile:
        """The hidden profile of ``flag`` while it is on (no effect if it has none)."""
        return self.flag_profiles.get(flag, Profile())


def load(path: Path | None = None) -> SimCatalogue:
    """The catalogue at ``path`` (default: packaged) with profiles from it or the packaged behaviour file.

    Raises CatalogueError naming the version and field."""
    catalogue = load_catalogue(path)
    if path is None:
        doc = yaml.safe_load(resources.files("gpuobs.exporter.sim").joinpath("data/behaviour.yaml").read_text())
        specs = (doc or {}).get("profiles") or {}
        flag_specs = (doc or {}).get("flag_profiles") or {}
    else:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))  # already parsed once: cannot fail here
        specs = {str(v): (s or {}).get("profile") for v, s in doc["releases"].items() if isinstance(s, dict)}
        flag_specs = {str(f): (s or {}).get("profile") for f, s in (doc.get("flags") or {}).items()}
    return SimCatalogue(catalogue, {str(v): _profile(f"release {v}", s) for v, s in specs.items() if str(v) in catalogue.releases},
                        {f: _profile(f"flag {f}", s) for f, s in flag_specs.items() if f in catalogue.flags})
