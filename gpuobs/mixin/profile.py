"""Rule profiles: the rule files as shipped (``default``) or shortened for rehearsing every failure in
minutes (``drill``). Production rule files are never modified; a profile is applied when a stack renders
its rules (:func:`gpuobs.stack.render.render_rules`).
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuobs.core import assets
from gpuobs.core.durations import parse_duration
from gpuobs.core.fleet import SHIPPED_FLEET, load_fleet
from gpuobs.mixin.kernel_log_rules import RECENT_S
from gpuobs.mixin.kernel_log_rules import render as render_kernel_log
from gpuobs.mixin.slo_rules import render_slo_rules

#: Stack profiles. ``default`` loads the repository's rule files as they are (realistic ``for:``
#: durations and windows, 30-day SLO). ``drill`` is for rehearsing every failure quickly
#: (``make drills``): every ``for:`` longer than DRILL_MAX_FOR is cut to it, every range selector of
#: 5 minutes or more is divided by DRILL_WINDOW_DIVISOR (10m -> 2m), and the SLO rules are
#: regenerated for a DRILL_SLO_PERIOD SLO period, which shrinks the burn-rate windows proportionally
#: (1d: 2m/30s x14.4 and 12m/1m x6 page; 144m/12m x1 ticket); offsets of 5 minutes or more are
#: divided like windows. Production rule files are never modified.
PROFILES = ("default", "drill")
DRILL_MAX_FOR = "20s"
DRILL_WINDOW_DIVISOR = 5
DRILL_SLO_PERIOD = "1d"


def _cap_for(text: str, cap: str) -> str:
    """Replace every ``for: <duration>`` longer than ``cap`` with ``cap`` (drill profile)."""
    limit = parse_duration(cap, "drill profile's for: cap")

    def sub(m: re.Match) -> str:
        return f"{m.group(1)}for: {cap}" if parse_duration(m.group(2), "for") > limit else m.group(0)
    return re.sub(r"(?m)^(\s*)for: ([0-9dhms]+)\s*$", sub, text)


def _shorten_windows(text: str, divisor: int) -> str:
    """Divide every PromQL range selector and ``offset`` of 5 minutes or more by ``divisor`` (drill
    profile; e.g. the stock Xid path's ``[1h] offset 5m`` becomes ``[720s] offset 60s``)."""
    def sub(m: re.Match) -> str:
        secs = int(parse_duration(m.group(1), "range selector"))
        return f"[{secs // divisor}s]" if secs >= 300 else m.group(0)

    def sub_offset(m: re.Match) -> str:
        secs = int(parse_duration(m.group(1), "offset"))
        return f"offset {secs // divisor}s" if secs >= 300 else m.group(0)
    text = re.sub(r"\[([0-9]+[dhms](?:[0-9]+[dhms])*)\]", sub, text)
    return re.sub(r"\boffset ([0-9]+[dhms](?:[0-9]+[dhms])*)\b", sub_offset, text)


def profile_rules(runbook_base: str, profile: str = "default", repo: Path | None = None) -> dict[str, str]:
    """File name -> text of every rule file under ``repo/prometheus/rules`` for ``profile``, with the
    runbook base applied. The files are the render of ``repo``'s fleet config (``prometheus/fleet.yaml``),
    and the drill profile regenerates the SLO and kernel-log files from that same config. Raises
    ValueError for an unknown profile, FleetConfigError for a bad fleet config."""
    repo = repo or assets.root()
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    fleet = load_fleet(repo / SHIPPED_FLEET)
    out = {}
    for rule_file in sorted((repo / "prometheus" / "rules").glob("*.yml")):
        if profile == "drill" and rule_file.name == "slo.yml":
            text = render_slo_rules(repo / "prometheus" / "slo.yaml", fleet, DRILL_SLO_PERIOD)
        elif profile == "drill" and rule_file.name == "gpu-kernel-log.yml":
            # Its "recent Xid" span is a constant, not a range selector: shorten it like the windows.
            text = render_kernel_log(fleet, RECENT_S // DRILL_WINDOW_DIVISOR)
        else:
            text = rule_file.read_text()
        if profile == "drill":
            text = _cap_for(text, DRILL_MAX_FOR)
            if rule_file.name != "slo.yml":  # the SLO file is regenerated for its own period instead
                text = _shorten_windows(text, DRILL_WINDOW_DIVISOR)
        out[rule_file.name] = text.replace(fleet.runbook_base + "/runbooks/", runbook_base.rstrip("/") + "/runbooks/")
    return out
