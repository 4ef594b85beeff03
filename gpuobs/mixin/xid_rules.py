"""The Xid rule file (``prometheus/rules/gpu-xid.yml``), code lists from the Xid catalogue
(:mod:`gpuobs.reference.xid`, design §6). The expressions live in :mod:`gpuobs.mixin.gpu_rules`
(stock "new (GPU, err_code) series" path, enhanced DCGM_EXP_XID_ERRORS_COUNT path); this module keeps
the ``gpuobs rules xid`` entry point.
"""

from __future__ import annotations

from gpuobs.mixin.fleet import FleetConfig


def xid_rules(cfg: FleetConfig | None = None) -> dict:
    """The ``gpu-xid`` rule group as a YAML-ready dict (comment keys ``"#"`` included)."""
    from gpuobs.mixin.gpu_rules import Rules

    return Rules(cfg or FleetConfig()).xid_file()


def render_xid_rules(cfg: FleetConfig | None = None) -> str:
    """YAML text of ``prometheus/rules/gpu-xid.yml`` for ``cfg`` (default: the default fleet config),
    exactly as ``gpuobs rules render`` writes it."""
    from gpuobs.mixin.render import rule_texts

    return rule_texts(cfg or FleetConfig())["prometheus/rules/gpu-xid.yml"]
