"""MIG (Multi-Instance GPU) profiles of the H100 80GB: instances per GPU, memory, instance ids.

Source: NVIDIA Multi-Instance GPU User Guide, "H100 MIG profiles" table (H100 80GB): 1g.10gb x7,
1g.20gb x4, 2g.20gb x3, 3g.40gb x2, 4g.40gb x1, 7g.80gb x1; GPU instance ids as ``nvidia-smi mig -lgi``
assigns them when the GPU is filled with one profile.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MigProfile:
    """A MIG profile: name (``1g.10gb``), compute slices of 7, memory per instance (MiB), instance ids."""

    name: str
    slices: int
    memory_mib: int
    instance_ids: tuple[int, ...]


PROFILES: dict[str, MigProfile] = {p.name: p for p in (
    MigProfile("1g.10gb", 1, 9856, (7, 8, 9, 10, 11, 12, 13)),
    MigProfile("1g.20gb", 1, 19968, (3, 4, 5, 6)),
    MigProfile("2g.20gb", 2, 19968, (3, 4, 5)),
    MigProfile("3g.40gb", 3, 40192, (1, 2)),
    MigProfile("4g.40gb", 4, 40192, (2,)),
    MigProfile("7g.80gb", 7, 80000, (0,)),
)}


def parse_mig_spec(spec: str, gpus: int) -> dict[int, MigProfile]:
    """Parse ``--mig-profile``: ``1g.10gb`` (every GPU) or ``0=1g.10gb,3=3g.40gb`` (per GPU index).

    Raises ValueError naming the bad profile or index and the allowed values.
    """
    out: dict[int, MigProfile] = {}
    allowed = ", ".join(PROFILES)
    for part in filter(None, (p.strip() for p in spec.split(","))):
        if "=" in part:
            idx_text, name = part.split("=", 1)
            try:
                idx = int(idx_text)
            except ValueError:
                raise ValueError(f"--mig-profile: GPU index {idx_text!r} is not an integer (0..{gpus - 1})") from None
            if not 0 <= idx < gpus:
                raise ValueError(f"--mig-profile: GPU index {idx} out of range 0..{gpus - 1}")
            targets = [idx]
        else:
            name, targets = part, list(range(gpus))
        if name not in PROFILES:
            raise ValueError(f"--mig-profile: unknown profile {name!r}; allowed: {allowed}")
        for t in targets:
            out[t] = PROFILES[name]
    return out
