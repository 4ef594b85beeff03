"""Release catalogue: release version -> what it ships (engine requirement, CUDA build).

Loaded from YAML (default: the packaged ``data/releases.yaml``). Shape::

    default: "1.4.0"
    releases:
      "1.4.0": {engine: "vllm==0.10.1", cuda: "12.8"}
    flags:                      # optional: boolean feature flags the engine evaluates (OpenFeature)
      spec_decode: {description: "speculative decoding with a draft model"}

Versions only: a release may also carry a ``profile`` key, the simulator's hidden behaviour for it
(:mod:`gpuobs.exporter.sim.behaviour`), which this loader ignores, so release tooling never sees it. The same holds for flags: the
simulator's hidden per-flag behaviour lives in ``gpuobs/exporter/sim/data/behaviour.yaml``.
Flag keys match :data:`FLAG_KEY` (flagd allows more; gpuobs keeps them label- and shell-safe).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


from gpuobs.core.errors import InputError
from gpuobs.reference import read_yaml


class CatalogueError(InputError):
    """The release catalogue is malformed; the message names the version and field."""


@dataclass(frozen=True)
class Release:
    """One version: name, engine requirement (``vllm==0.11.0``) and CUDA build."""

    version: str
    engine: str
    cuda: str


#: A flag key: lower-case letter, then lower-case letters, digits and underscores (at most 63).
FLAG_KEY = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Flag:
    """One boolean feature flag the serving engine evaluates: its key and what it switches."""

    name: str
    description: str


@dataclass(frozen=True)
class Catalogue:
    """All releases, the version nodes start on, and the feature flags (off unless a flag file says so)."""

    default: str
    releases: dict[str, Release]
    flags: dict[str, Flag] = field(default_factory=dict)

    def flag(self, name: str) -> Flag:
        """The flag ``name``; KeyError listing the known flags otherwise."""
        try:
            return self.flags[name]
        except KeyError:
            raise KeyError(f"unknown flag {name!r}; known: {', '.join(self.flags) or 'none'}") from None

    def get(self, version: str) -> Release:
        """The release named ``version``; KeyError listing the known versions otherwise."""
        try:
            return self.releases[version]
        except KeyError:
            raise KeyError(f"unknown version {version!r}; known: {', '.join(self.releases)}") from None


def load(path: Path | None = None) -> Catalogue:
    """Parse a catalogue file (default: packaged). Raises CatalogueError naming the bad field."""
    where = "packaged catalogue" if path is None else str(path)
    try:
        doc = read_yaml(path, "releases.yaml")
    except ValueError as exc:
        raise CatalogueError(f"release catalogue {where}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("releases"), dict) or not doc["releases"]:
        raise CatalogueError("release catalogue needs a non-empty 'releases' mapping")
    releases = {}
    for version, spec in doc["releases"].items():
        version = str(version)
        if not isinstance(spec, dict):
            raise CatalogueError(f"release {version}: must be a mapping")
        for key in ("engine", "cuda"):
            if not isinstance(spec.get(key), str):
                raise CatalogueError(f"release {version}: field '{key}' must be a string")
        releases[version] = Release(version, spec["engine"], spec["cuda"])
    default = str(doc.get("default", next(iter(releases))))
    if default not in releases:
        raise CatalogueError(f"default version {default!r} is not in releases")
    flags = {}
    specs = doc.get("flags") or {}
    if not isinstance(specs, dict):
        raise CatalogueError("release catalogue: 'flags' must be a mapping of flag key -> {description: ...}")
    for name, spec in specs.items():
        if not isinstance(name, str) or not FLAG_KEY.match(name):
            raise CatalogueError(f"flag {name!r}: key must match {FLAG_KEY.pattern}")
        if not isinstance(spec, dict) or not isinstance(spec.get("description"), str):
            raise CatalogueError(f"flag {name}: field 'description' must be a string")
        flags[name] = Flag(name, spec["description"])
    return Catalogue(default, releases, flags)
