"""Driver catalogue: the NVIDIA Linux drivers the simulated fleet can install, and the CUDA each supports.

Loaded from YAML (default: the packaged ``data/drivers.yaml``). Shape::

    default: "550.54.15"              # the driver nodes start on
    drivers:
      "570.172.08": {cuda: "12.8", build: "Tue Jul  8 18:31:33 UTC 2025"}

``cuda`` (required) is the highest CUDA toolkit version (``major.minor``) the driver supports: the newest
row of ``cuda_driver_min.csv`` whose Linux x86_64 toolkit minimum the driver meets (NVIDIA CUDA release
notes, Table 3); the loader checks it against that table. ``build`` (optional) is the build stamp the
kernel module prints when it loads. Versions only: how a driver behaves on each simulated GPU model is
the simulator's hidden ``driver_profiles`` (:mod:`gpuobs.exporter.sim.behaviour`); this loader never
reads it, so release tooling never sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


from gpuobs.core.errors import InputError
from gpuobs.reference import read_yaml
from gpuobs.reference.compat import CompatInputError, cuda_releases, parse_cuda, parse_driver

DRIVER_KEYS = ("cuda", "build")


class DriverCatalogueError(InputError):
    """The driver catalogue is malformed; the message names the version and the field."""


@dataclass(frozen=True)
class Driver:
    """One driver: ``version`` (``570.172.08``), ``branch`` (570), ``cuda`` (highest CUDA it supports,
    ``12.8``) and ``build`` (the module's build stamp, ``""`` when unknown)."""

    version: str
    branch: int
    cuda: str
    build: str = ""

    @property
    def load_line(self) -> str:
        """What the kernel module prints when it loads (nv.c's ``NVRM: loading %s`` with its NVRM id:
        two spaces before and after the version, the build stamp where known)."""
        return f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {self.version}" + (f"  {self.build}" if self.build else "")


@dataclass(frozen=True)
class DriverCatalogue:
    """All drivers by version, and the one nodes start on (``default``)."""

    default: str
    drivers: dict[str, Driver]

    def get(self, version: str) -> Driver:
        """The driver ``version``; KeyError listing the known versions otherwise."""
        try:
            return self.drivers[version]
        except KeyError:
            raise KeyError(f"unknown driver version {version!r}; known: {', '.join(self.drivers)}") from None


def highest_cuda(version: str) -> str:
    """The highest CUDA ``major.minor`` driver ``version`` supports per ``cuda_driver_min.csv`` (the
    newest row whose Linux x86_64 toolkit minimum it meets); ``""`` below every row. CompatInputError
    for a malformed version."""
    drv = parse_driver(version, "version")
    best = max((r.version.key for r in cuda_releases() if r.toolkit_min is not None and r.toolkit_min <= drv),
               default=None)
    return f"{best[0]}.{best[1]}" if best else ""


def load(path: Path | None = None) -> DriverCatalogue:
    """Parse a driver catalogue (default: packaged). Raises DriverCatalogueError naming the version and
    field: unreadable YAML, no ``drivers`` mapping, a version that is not ``NNN.NN[.NN]``, ``cuda``
    missing, malformed or not the highest the driver supports, ``build`` not a string, an unknown key,
    a ``default`` not in ``drivers``."""
    where = "packaged driver catalogue" if path is None else f"driver catalogue {path}"
    try:
        doc = read_yaml(path, "drivers.yaml")
    except ValueError as exc:
        raise DriverCatalogueError(f"{where}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("drivers"), dict) or not doc["drivers"]:
        raise DriverCatalogueError(f"{where}: needs a non-empty 'drivers' mapping of version -> {{cuda, build}}")
    drivers: dict[str, Driver] = {}
    for version, spec in doc["drivers"].items():
        version = str(version)
        try:
            drv = parse_driver(version, "version")
        except CompatInputError:
            raise DriverCatalogueError(f"{where}: driver {version!r}: the version must look like 570.172.08 "
                                       f"(a 3-digit branch and 1 or 2 more numeric parts)") from None
        if not isinstance(spec, dict):
            raise DriverCatalogueError(f"{where}: driver {version}: must be a mapping with {', '.join(DRIVER_KEYS)}")
        unknown = sorted(set(map(str, spec)) - set(DRIVER_KEYS))
        if unknown:
            raise DriverCatalogueError(f"{where}: driver {version}: unknown field {unknown[0]!r}; allowed: "
                                       f"{', '.join(DRIVER_KEYS)}")
        cuda = spec.get("cuda")
        try:
            parsed = parse_cuda(cuda, "cuda")
        except CompatInputError:
            raise DriverCatalogueError(f"{where}: driver {version}: field 'cuda' must be a CUDA version string "
                                       f"like \"12.8\"; got {cuda!r}") from None
        expected = highest_cuda(version)
        if f"{parsed.major}.{parsed.minor}" != expected or parsed.patch is not None:
            raise DriverCatalogueError(f"{where}: driver {version}: field 'cuda' must be the highest CUDA it "
                                       f"supports per cuda_driver_min.csv, {expected or 'none'}; got {cuda!r}")
        build = spec.get("build", "")
        if not isinstance(build, str):
            raise DriverCatalogueError(f"{where}: driver {version}: field 'build' must be a string")
        drivers[version] = Driver(version, drv.branch, str(cuda), build)
    default = str(doc.get("default", next(iter(drivers))))
    if default not in drivers:
        raise DriverCatalogueError(f"{where}: field 'default' {default!r} is not in drivers; known: "
                                   f"{', '.join(drivers)}")
    return DriverCatalogue(default, drivers)
