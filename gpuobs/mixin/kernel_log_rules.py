"""Generate ``prometheus/rules/gpu-kernel-log.yml``: alerts on logwatch's kernel-log counters.

``gpuobs rules kernel-log`` prints the file; ``--check FILE`` exits 1 if FILE differs. Code
lists come from the Xid catalogue (:mod:`gpuobs.reference.xid`, the same split as ``gpu-xid.yml``).

One page per incident, with the DCGM path (docs/logwatch.md):

* Which path pages for a node is decided in the rule expressions, not in Alertmanager: DCGM's
  ``GpuXidCritical``/``GpuXidWarning`` (``gpu-xid.yml``) stand aside ``unless on (<identity>)`` the
  node's logwatch read its kernel-log source within :data:`GAP_TOLERANCE` (``gpuobs_logwatch_source_up``).
  An Alertmanager inhibition whose source must first reach a restarted Alertmanager let both paths page
  for one Xid (issue 32); an expression cannot lose that choice. Where logwatch is absent or broken,
  the DCGM alerts page as before.
* ``GpuKernelXidCritical``/``Warning`` fire at the first evaluation that sees the line: the page
  arrives within one scrape + one evaluation + Alertmanager's group_wait. The memory codes (48, 63,
  64, 94, 95) are not held back for DCGM's ECC and row-remap alerts of the same fault: Alertmanager
  groups the hardware families by (identity, gpu) (``alertmanager.yml``), so the later
  ``GpuEccDoubleBitError`` joins the Xid's group and its incident instead of paging again.
* Every "present now" term reads ``last_over_time(...[GAP_TOLERANCE])``: a failed scrape or a
  logwatch restart during an open incident neither resolves nor re-opens it.
* ``GpuFallenOffBus`` (Xid 79 / "GPU has fallen off the bus", and the GPU absent from DCGM's page)
  pages at once and inhibits ``GpuMissing`` on its node.
* ``GpuKernelXidRepeated`` pages again when one GPU logs the same paging code 3 times within an
  hour (gpuobs policy: a repeat is RMA evidence, NVIDIA's Xid 48/13 workflows escalate on repeats).
"""

from __future__ import annotations

import yaml

from gpuobs.core.fleet import FleetConfig
from gpuobs.mixin.gpu_rules import GAP_TOLERANCE
from gpuobs.mixin.runbooks import runbook_url
from gpuobs.reference import xid

#: Seconds an Xid stays "recent" after logwatch counted it (like dcgm-exporter's 5-minute Xid window).
#: The stack's drill profile divides it (gpuobs.mixin.profile).
RECENT_S = 300
REPEAT_THRESHOLD = 3
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
    sel = f'{{{cfg.identity_label}!="",xid=~"{regex}"}}'
    return (f"max by ({_gpu(cfg)}, xid) (last_over_time(gpuobs_xid_events_total{sel}[{GAP_TOLERANCE}]) "
            f"and (time() - last_over_time(gpuobs_xid_last_event_timestamp_seconds{sel}[{GAP_TOLERANCE}])) < {recent_s})")


def _xid_alert(cfg: FleetConfig, name: str, codes: list[int], severity: str, summary: str, recent_s: int) -> dict:
    """One kernel-log Xid alert over ``codes``: fires at the first evaluation that sees a line."""
    return {"alert": name, "expr": _recent_xid(cfg, codes, recent_s),
            "labels": {"severity": severity, "family": "xid"},
            "annotations": {"summary": summary,
                            "description": DESCRIPTION % (cfg.identity_label, _span(recent_s)),
                            "runbook_url": runbook_url(cfg.runbook_base, "xid", name)}}


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
    sxid = f'{{{ident}!="",sxid_fatal="fatal"}}'
    rules = [
        _xid_alert(cfg, "GpuKernelXidCritical", crit, "critical",
                "The kernel log shows an Xid whose NVIDIA action is reset the GPU, reboot the node or RMA.", recent_s),
        _xid_alert(cfg, "GpuKernelXidWarning", xid.ticket_codes(), "warning",
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
         "expr": (f'max by ({gpu}) (last_over_time(gpuobs_gpu_fallen_off_bus{{{ident}!=""}}[{GAP_TOLERANCE}]) == 1) '
                  f"unless on ({ident}, pci_bus_id) DCGM_FI_DEV_GPU_TEMP{{{cfg.dcgm_selector}}}"),
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
         "expr": (f'max by ({ident}, device, pci_bus_id, sxid) (last_over_time(gpuobs_sxid_events_total{sxid}[{GAP_TOLERANCE}]) '
                  f"and (time() - last_over_time(gpuobs_sxid_last_event_timestamp_seconds{sxid}[{GAP_TOLERANCE}])) < {recent_s})"),
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
            "# pages with the DCGM path: gpuobs/mixin/kernel_log_rules.py, gpu-xid.yml and alertmanager/alertmanager.yml.\n")
    return head + yaml.safe_dump(kernel_log_rules(cfg, recent_s), sort_keys=False, width=4096)
