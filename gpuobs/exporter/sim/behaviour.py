"""Hidden behaviour of each release in the simulator: what a version does to latency, errors and memory.

Release tooling (compat, canary, rollout) never imports this module: the canary must find a regression
from metrics alone. Profiles come from the packaged ``data/behaviour.yaml`` (``profiles: {version:
{...}}``) or, for a custom catalogue passed with ``gpuobs exporter --releases FILE``, from that file's
``profile`` key per release; a version without one behaves like the baseline.

Feature flags have profiles too (``flag_profiles: {flag: {...}}`` in the packaged file, or a custom
catalogue's ``profile`` key per flag): what a flag does while it is on. A node's effective profile is
:func:`combine` of its release's, those of its flags that are on, its driver's on its GPU model
(:class:`DriverProfile`) and its GPU model's latency scale.

Drivers (``driver_profiles: {version: {<modelName or "*">: {...}}}`` in the packaged file) have hidden
profiles per GPU model: what the driver does while it runs on that model (latency, errors, an Xid rate,
a failing health check). :func:`driver_profile` looks one up; the driver catalogue
(:mod:`gpuobs.reference.drivers`) never reads them.
"""

from __future__ import annotations

import functools
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


DRIVER_FIELDS = ("ttft_multiplier", "itl_multiplier", "error_rate_delta", "xid_per_hour", "xid_code", "diag_fails")
#: Xid a driver profile raises when it names a rate but no code: 13 (Graphics Engine Exception, an
#: application/driver-class Xid in NVIDIA's catalogue).
DEFAULT_DRIVER_XID = 13


@dataclass(frozen=True)
class DriverProfile:
    """Hidden behaviour of a driver on one GPU model: TTFT/ITL multipliers and added error ratio (on the
    serving engine, like a release's), ``xid_per_hour`` (Poisson rate of Xid ``xid_code`` on the node,
    Xids per hour, 0 = none) and ``diag_fails`` (the active health check fails while it runs)."""

    ttft_multiplier: float = 1.0
    itl_multiplier: float = 1.0
    error_rate_delta: float = 0.0
    xid_per_hour: float = 0.0
    xid_code: int = DEFAULT_DRIVER_XID
    diag_fails: bool = False

    @property
    def serving(self) -> Profile:
        """The part that acts on the serving engine, as a :class:`Profile` for :func:`combine`."""
        return Profile(self.ttft_multiplier, self.itl_multiplier, self.error_rate_delta)


def _driver_profile(where: str, spec: object) -> DriverProfile:
    """One ``driver_profiles`` entry; CatalogueError naming ``where`` and the field."""
    if spec is None:
        return DriverProfile()
    if not isinstance(spec, dict):
        raise CatalogueError(f"{where}: must be a mapping with fields {', '.join(DRIVER_FIELDS)}")
    out: dict[str, object] = {}
    for key, value in spec.items():
        if key not in DRIVER_FIELDS:
            raise CatalogueError(f"{where}: unknown field {key!r}; fields: {', '.join(DRIVER_FIELDS)}")
        if key == "diag_fails":
            if not isinstance(value, bool):
                raise CatalogueError(f"{where}: field 'diag_fails' must be true or false, got {value!r}")
            out[key] = value
        elif key == "xid_code":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
                raise CatalogueError(f"{where}: field 'xid_code' must be an Xid code 1..65535, got {value!r}")
            out[key] = value
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise CatalogueError(f"{where}: field {key!r} must be a number, got {value!r}")
            low = 0.0 if key in ("xid_per_hour",) else -1.0 if key == "error_rate_delta" else 1e-3
            if not low <= float(value) <= 1e6:
                raise CatalogueError(f"{where}: field {key!r} must be between {low:g} and 1e6, got {value!r}")
            out[key] = float(value)
    return DriverProfile(**out)


def parse_driver_profiles(doc: object) -> dict[str, dict[str, DriverProfile]]:
    """``driver_profiles`` (``{version: {<modelName or "*">: {...}}}``) as version -> model -> profile.
    CatalogueError naming the version, model and field."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise CatalogueError("driver_profiles: must map driver versions to {<modelName or \"*\">: profile}")
    out: dict[str, dict[str, DriverProfile]] = {}
    for version, models in doc.items():
        if models is not None and not isinstance(models, dict):
            raise CatalogueError(f"driver_profiles {version}: must map GPU model names (or \"*\") to profiles")
        out[str(version)] = {str(m): _driver_profile(f"driver_profiles {version} {m}", p)
                             for m, p in (models or {}).items()}
    return out


@functools.cache
def packaged_driver_profiles() -> dict[str, dict[str, DriverProfile]]:
    """The packaged ``driver_profiles`` (version -> model name or ``*`` -> profile)."""
    doc = yaml.safe_load(resources.files("gpuobs.exporter.sim").joinpath("data/behaviour.yaml").read_text())
    return parse_driver_profiles((doc or {}).get("driver_profiles"))


def driver_profile(version: str, model_name: str,
                   profiles: dict[str, dict[str, DriverProfile]] | None = None) -> DriverProfile:
    """The hidden behaviour of driver ``version`` on GPU model ``model_name`` (``NVIDIA L40S``): the
    model's own entry, else the version's ``*`` entry, else the baseline. ``profiles``: default packaged."""
    by_model = (packaged_driver_profiles() if profiles is None else profiles).get(version, {})
    return by_model.get(model_name) or by_model.get("*") or DriverProfile()


@dataclass(frozen=True)
class SimCatalogue:
    """The release catalogue plus each version's and each flag's hidden profile."""

    catalogue: Catalogue
    profiles: dict[str, Profile]
    flag_profiles: dict[str, Profile] = field(default_factory=dict)
    #: Driver version -> GPU model name (or ``*``) -> :class:`DriverProfile` (default: packaged).
    driver_profiles: dict[str, dict[str, DriverProfile]] = field(default_factory=packaged_driver_profiles)

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

    def driver_profile(self, version: str, model_name: str) -> DriverProfile:
        """The hidden behaviour of driver ``version`` on GPU model ``model_name`` (see :func:`driver_profile`)."""
        return driver_profile(version, model_name, self.driver_profiles)


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
