"""Does the fleet still match the recorded end of a rollout? (``gpuobs rollout status`` warns if not.)

After ``make down; make up`` the simulated engines start on the default release again while the
rollout store still says "Succeeded 1.5.0"; a person reading ``rollout status`` must be told. Expected
fleet per terminal state: Succeeded -> every rollout host runs the rollout's version; RolledBack,
Aborted, Rejected -> no host runs it (rolled back, or never deployed).
"""

from __future__ import annotations

from typing import Any

from gpuobs.rollout.model import ABORTED, REJECTED, ROLLED_BACK, SUCCEEDED


def drift(rec: Any, version_of: Any) -> list[str]:
    """Lines describing each host whose running version contradicts ``rec`` (empty: consistent, or the
    rollout has not ended). ``version_of(host) -> str`` reads the fleet; a host that cannot be read
    is reported as such (an exception's message), never raised."""
    hosts = list(rec.spec.get("hosts") or [])
    if rec.state not in (SUCCEEDED, ROLLED_BACK, ABORTED, REJECTED):
        return []
    out = []
    for h in hosts:
        try:
            v = version_of(h)
        except Exception as exc:  # noqa: BLE001 (an unreachable node is itself worth a line)
            out.append(f"{h}: version unknown ({str(exc)[:120]})")
            continue
        if rec.state == SUCCEEDED and v != rec.version:
            out.append(f"{h} runs {v}, not {rec.version} which this rollout left it on")
        elif rec.state != SUCCEEDED and v == rec.version:
            out.append(f"{h} runs {rec.version}, which this rollout ended {rec.state}")
    return out
