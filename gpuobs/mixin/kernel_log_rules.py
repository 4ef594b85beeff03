"""Generate ``prometheus/rules/gpu-kernel-log.yml``: alerts on logwatch's kernel-log counters.

``gpuobs rules kernel-log`` prints the file; ``--check FILE`` exits 1 if FILE differs. Code
lists come from the Xid catalogue (:mod:`gpuobs.reference.xid`, the same split as ``gpu-xid.yml``).

One page per incident, with the DCGM path (design §6):

* ``GpuKernelLogWatching`` (info, never routed) fires while a node's logwatch reads its source;
  Alertmanager inhibits that node's DCGM ``GpuXidCritical``/``GpuXidWarning`` with it, so where the
  kernel log is read it is the one Xid path (it sees every event; DCGM's window count does not see
  Xid 79/119/120 and a stock exporter has no count at all). Where logwatch is absent or broken the
  source resolves and the DCGM alerts page as before. The source fires all the time, so the
  inhibition does not depend on which path is faster.
* ``GpuKernelXidCritical``/``Warning`` fire at the first evaluation that sees the line, except for
  the memory codes in :data:`HOLD_OFF_XIDS`: DCGM's ECC and row-remap counters raise their own alerts
  for the same fault (``GpuEccDoubleBitError``, ``GpuRowRemapFailure``, ``GpuRowRemapPending``; DCGM's
  default collect interval is 30 s), so for those codes the kernel-log alert waits ``for: 1m`` and is
  inhibited by the hardware alert that fired first.
* ``GpuFallenOffBus`` (Xid 79 / "GPU has fallen off the bus", and the GPU absent from DCGM's page)
  pages at once and inhibits ``GpuMissing`` (``for: 30s``) on its node.
* ``GpuKernelXidRepeated`` pages again when one GPU logs the same paging code 3 times within an
  hour (gpuobs policy: a repeat is RMA evidence, NVIDIA's Xid 48/13 workflows escalate on repeats).
"""

from __future__ import annotations

import yaml

from gpuobs.core.fleet import FleetConfig
from gpuobs.mixin.runbooks import runbook_url
from gpuobs.reference import xid

#: Seconds an Xid stays "recent" after logwatch counted it (like dcgm-exporter's 5-minute Xid window).
#: It must not outlast the DCGM alerts that inhibit the memory codes (GpuEccDoubleBitError looks 10
#: minutes back), or a held kernel-log page would go out when they resolve. The stack's drill profile
#: divides both by the same factor (gpuobs.stack.render).
RECENT_S = 300
REPEAT_THRESHOLD = 3
#: Uncorrectable memory errors and row remapping (48 DBE, 63 remap pending, 64 remap failure,
#: 94/95 contained/uncontained): DCGM's ECC/row-remap counters alert on the same fault.
HOLD_OFF_XIDS = frozenset({48, 63, 64, 94, 95})
HOLD_OFF_FOR = "1m"
REPEAT_WINDOW = "1h"

DESCRIPTION = ("GPU {{ $labels.gpu }} ({{ $labels.UUID }}, PCI {{ $labels.pci_bus_id }}) on {{ $labels.%s }} "
               "logged Xid {{ $labels.xid }} in the last %s ({{ $value }} such kernel-log line(s) since "
               "logwatch's state began). Save the NVRM lines (`journalctl -k | grep -E 'NVRM: (Xid|GPU)'`) "
               "and follow the runbook for this code.")


def _span(seconds: int) -> str:
    return f"{seconds // 60} minutes" if seconds % 60 == 0 and seconds >= 120 else f"{seconds} seconds"


def _gpu(cfg: FleetConfig) -> str:
    """The labels that name one GPU in logwatch's series, the identity label first."""
    return f"{cfg.identity_label}, gpu, UUID, pci_bus_id"


def _recent_xid(cfg: FleetConfig, codes: list[int], recent_s: int) -> str:
    regex = "|".join(map(str, codes))
    return (f'max by ({_gpu(cfg)}, xid) (gpuobs_xid_events_total{{{cfg.identity_label}!="",xid=~"{regex}"}} '
            f"and (time() - gpuobs_xid_last_event_timestamp_seconds) < {recent_s})")


def _split(cfg: FleetConfig, name: str, codes: list[int], severity: str, summary: str, recent_s: int) -> list[dict]:
    """One alert name as two rules: the codes DCGM's counters do not pair with (no ``for``), and the
    :data:`HOLD_OFF_XIDS` among ``codes`` (``for: 1m``)."""
    now = [c for c in codes if c not in HOLD_OFF_XIDS]
    held = [c for c in codes if c in HOLD_OFF_XIDS]
    out = []
    # The held rule carries xid_class="memory": the two rules must differ in labels (promtool rejects
    # duplicate rules), and the label says why this page waited.
    for group, extra, more in ((now, {}, {}), (held, {"for": HOLD_OFF_FOR}, {"xid_class": "memory"})):
        if group:
            out.append({"alert": name, "expr": _recent_xid(cfg, group, recent_s), **extra,
                        "labels": {"severity": severity, "family": "xid", **more},
                        "annotations": {"summary": summary,
                                        "description": DESCRIPTION % (cfg.identity_label, _span(recent_s)),
                                        "runbook_url": runbook_url(cfg.runbook_base, "xid", name)}})
    return out


def kernel_log_rules(cfg: FleetConfig, recent_s: int = RECENT_S) -> dict:
    """The ``gpu-kernel-log`` rule group for the fleet config ``cfg`` (identity label, runbook base) as a
    YAML-ready dict; ``recent_s``: how long an Xid or SXid line keeps its alert firing (seconds > 0)."""
    if recent_s <= 0:
        raise ValueError(f"recent_s must be > 0 seconds, got {recent_s}")
    ident, gpu = cfg.identity_label, _gpu(cfg)

    def url(file: str, alert: str) -> str:
        return runbook_url(cfg.runbook_base, file, alert)
    crit = [c for c in xid.critical_codes() if c != 79]  # 79 is GpuFallenOffBus
    crit_re = "|".join(map(str, crit))
    total = f'gpuobs_xid_events_total{{{ident}!="",xid=~"{crit_re}"}}'
    rules = [
        {"alert": "GpuKernelLogWatching",
         "expr": f'max by ({ident}) (gpuobs_logwatch_source_up{{{ident}!=""}}) == 1',
         "labels": {"severity": "info", "family": "xid"},
         "annotations": {
             "summary": "logwatch reads this node's kernel log; the node's DCGM Xid alerts are inhibited in its favour.",
             "description": f"logwatch on {{{{ $labels.{ident} }}}} is reading its kernel-log source, so Xid pages for "
                            "this node come from the kernel log (every event, exact counts) and Alertmanager "
                            "inhibits the DCGM window-count alerts GpuXidCritical/GpuXidWarning.",
             "runbook_url": url("xid", "GpuKernelLogWatching")}},
        *_split(cfg, "GpuKernelXidCritical", crit, "critical",
                "The kernel log shows an Xid whose NVIDIA action is reset the GPU, reboot the node or RMA.", recent_s),
        *_split(cfg, "GpuKernelXidWarning", xid.ticket_codes(), "warning",
                "The kernel log shows an application-class or recoverable Xid; the owning team should look.", recent_s),
        {"alert": "GpuKernelXidRepeated",
         # A series younger than the window compares against 0 (`or ... * 0`): its whole count is recent.
         "expr": (f"max by ({gpu}, xid) ({total} - ({total} offset {REPEAT_WINDOW} or {total} * 0)) "
                  f">= {REPEAT_THRESHOLD}"),
         "labels": {"severity": "critical", "family": "xid"},
         "annotations": {
             "summary": f"One GPU logged the same paging Xid {REPEAT_THRESHOLD}+ times within {REPEAT_WINDOW}: "
                        "take it out of service and collect RMA evidence.",
             "description": "GPU {{ $labels.gpu }} ({{ $labels.UUID }}, PCI {{ $labels.pci_bus_id }}) on "
                            f"{{{{ $labels.{ident} }}}} logged Xid {{{{ $labels.xid }}}} {{{{ $value }}}} times in the last "
                            f"{REPEAT_WINDOW}. Drain the node, save the kernel log lines and a "
                            "`nvidia-bug-report.sh` archive, run field diagnostics and open the RMA.",
             "runbook_url": url("xid", "GpuKernelXidRepeated")}},
        {"alert": "GpuFallenOffBus",
         # The log says the GPU fell off the bus this boot, and DCGM does not see it (any more): a GPU
         # that was reset and is back on DCGM's page resolves the alert.
         "expr": (f'max by ({gpu}) (gpuobs_gpu_fallen_off_bus{{{ident}!=""}} == 1) '
                  f"unless on ({ident}, pci_bus_id) DCGM_FI_DEV_GPU_TEMP"),
         # It inhibits GpuMissing and ServingEngineDown (alertmanager.yml), which resolve from the same
         # returning DCGM series but in other rule groups, up to an evaluation later: held a minute past
         # its own resolution, it still covers them while they resolve, instead of letting a still-firing
         # GpuMissing page once the inhibition lifts (seen in `make drills-ha`). Prometheus >= 2.42.
         "keep_firing_for": "1m",
         "labels": {"severity": "critical", "family": "gpu-missing"},
         "annotations": {
             "summary": "The kernel log says a GPU fell off the bus (Xid 79) and it is gone from DCGM's page.",
             "description": "GPU {{ $labels.gpu }} ({{ $labels.UUID }}, PCI {{ $labels.pci_bus_id }}) on "
                            f"{{{{ $labels.{ident} }}}} fell off the bus (NVRM Xid 79 / 'GPU has fallen off the bus.'). "
                            "Its jobs have failed; DCGM cannot report this Xid (DCGM #162). Drain and reboot the node.",
             "runbook_url": url("xid", "GpuFallenOffBus")}},
        {"alert": "GpuNvSwitchSXidFatal",
         "expr": (f'max by ({ident}, device, pci_bus_id, sxid) (gpuobs_sxid_events_total{{{ident}!="",sxid_fatal="fatal"}} '
                  f"and (time() - gpuobs_sxid_last_event_timestamp_seconds) < {recent_s})"),
         "labels": {"severity": "critical", "family": "interconnect"},
         "annotations": {
             "summary": "An NVSwitch logged a fatal SXid: NVLink traffic through it is broken until it is reset.",
             "description": f"{{{{ $labels.device }}}} (PCI {{{{ $labels.pci_bus_id }}}}) on {{{{ $labels.{ident} }}}} logged "
                            "fatal SXid {{ $labels.sxid }} in the last " + _span(recent_s) + ".",
             "runbook_url": url("interconnect", "GpuNvSwitchSXidFatal")}},
    ]
    return {"groups": [{"name": "gpu-kernel-log", "rules": rules}]}


def render(cfg: FleetConfig, recent_s: int = RECENT_S) -> str:
    """YAML text of ``prometheus/rules/gpu-kernel-log.yml`` for ``cfg``, exactly as ``gpuobs rules render``
    writes it."""
    head = ("# GENERATED by `gpuobs rules render` from prometheus/fleet.yaml and gpuobs/reference/data/xid_catalog.csv\n"
            "# -- do not edit by hand. Alerts on logwatch's kernel-log counters (docs/logwatch.md); how they avoid double\n"
            "# pages with the DCGM path: gpuobs/mixin/kernel_log_rules.py and alertmanager/alertmanager.yml.\n")
    return head + yaml.safe_dump(kernel_log_rules(cfg, recent_s), sort_keys=False, width=4096)
