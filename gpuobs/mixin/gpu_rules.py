"""The GPU, serving, training and fleet rule files, generated from the fleet config (:mod:`gpuobs.core.fleet`).

Why Python dicts and not text templates: every expression is composed from the same parts (the
identity label, the configured selectors, a family's stock and enhanced paths and the combinator
that makes the best signal win), and composing them in code keeps one definition of each part; the
output goes through PyYAML (:mod:`gpuobs.mixin.yamlout`), so it is always valid YAML, and no template
engine is added to the dependencies.

Contract of every rule (docs/strategy.md, docs/real-fleet.md; tests/mixin check it):

* every DCGM series is read through the configured DCGM selector, every vLLM series through the
  vLLM selector, and every series with ``<identity>!=""``: a series without the identity label never
  joins, groups or alerts (GpuTelemetryWithoutIdentity tickets it instead);
* per-GPU alerts carry exactly ``<identity>, gpu, UUID, pci_bus_id, modelName`` (plus ``xid`` for Xid
  alerts), whatever the host-label mode or scrape shape (``Hostname``, ``pod``, ``instance``,
  ``exported_*`` and ``GPU_I_ID`` are aggregated away), so pod churn, exporter restarts and MIG do not
  create new alerts, and the stock and enhanced paths produce the same alert;
* a family with both paths evaluates ``enhanced or (stock unless on (<identity>, gpu) <enhanced
  series present>)``: the richer signal wins where its series exist, the stock one everywhere else,
  and nothing pages twice (:func:`combine`).
"""

from __future__ import annotations

import re

from gpuobs.core.fleet import FleetConfig
from gpuobs.mixin.runbooks import runbook_url
from gpuobs.reference import xid
from gpuobs.reference.dcgm_exporter import POWER_FAULT_BITS, THROTTLE_BITS

#: The clock-event field under its current and its legacy name (the metric takes the name the CSV uses).
CLOCK_EVENT_FIELDS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
#: Stock throttling: the SM clock below this fraction of its maximum over the last hour ...
THROTTLE_CLOCK_RATIO = 0.85
#: ... while busy (GPU_UTIL %, or GR_ENGINE_ACTIVE ratio on MIG instances, which have no GPU_UTIL; an idle
#: GPU parks its clock, which is not throttling) ...
BUSY_UTIL_PCT = 50
#: ... with the temperature at the slowdown point in the last 2 minutes (within this many degrees under
#: it: the clock governor holds a throttled GPU just below the slowdown temperature, in a ~2 C band, see
#: gpuobs/exporter/sim/gpu.py), or power under POWER_COLLAPSE_RATIO of its maximum over the last hour (a
#: power brake; a GPU at its power cap under dense load keeps its power and runs cooler). The enhanced
#: path uses the same collapse test, where the clock-event bits are absent, to tell a power brake's
#: DCGM_FI_DEV_POWER_VIOLATION time from a healthy GPU's time at its power cap.
SLOWDOWN_BAND_C = 3
POWER_COLLAPSE_RATIO = 0.5
#: Fragmentation / FB growth threshold: 16 KiB/s (~1.4 GB/day), the slow leak that OOMs on day 3.
GROWTH_BYTES_PER_S = 16384
MIB = 1048576
#: How long a series may be missing (failed scrapes, an exporter or agent restart, a MIG re-partition)
#: before the rules treat it as gone: the "present now" term of an incident reads
#: ``last_over_time(...[GAP_TOLERANCE])``, so such a gap neither resolves an open incident (a second
#: page when it comes back) nor looks like a GPU gone. Its cost: an alert resolves, and a GPU truly gone
#: pages, up to this much later.
GAP_TOLERANCE = "2m"


#: The label that names a target whose series lack the identity label (a scrape without the identity
#: relabelling): unique per target on every scrape shape, unlike dcgm-exporter's ``Hostname``
#: (``localhost`` or the exporter pod's name on every node alike; docs/real-fleet.md, step 3).
FALLBACK_IDENTITY = "instance"
#: Alerts that never get a degraded twin: meta alerts, the ticket that names the targets without the
#: identity label, and fleet-level alerts (no identity in their labels).
NEVER_DEGRADED = frozenset({"Watchdog", "GpuTelemetryWithoutIdentity", "GpuDriverSkew"})
#: A recording rule's name (level:metric:operations); recorded series carry only the identity label's
#: grouping, so an alert that reads one cannot degrade.
_RECORDED = re.compile(r"\b[a-z_]+:[a-z_]+:[a-z0-9_]+\b")


class Rules:
    """Builds every rule group for one FleetConfig.

    ``fallback=True`` builds the same expressions for the series that LACK the identity label
    (``<identity>="", instance!=""``), grouped and joined on :data:`FALLBACK_IDENTITY` instead:
    :func:`degrade` adds them to the alerts so that a fleet scraped without the relabelling still
    pages, named by its targets (issue 32, "degrade, never go blind")."""

    def __init__(self, cfg: FleetConfig, fallback: bool = False):
        self.cfg = cfg
        self.fallback = fallback
        #: the identity label, the labels that name one GPU, and (identity, gpu): ``by``/``on`` lists
        self.identity = FALLBACK_IDENTITY if fallback else cfg.identity_label
        #: the matchers every selector carries: a non-empty identity (or, for the fallback, none and a target)
        self.has_identity = (f'{cfg.identity_label}="", {FALLBACK_IDENTITY}!=""' if fallback
                             else f'{cfg.identity_label}!=""')
        self.gpu_labels = f"{self.identity}, gpu, UUID, pci_bus_id, modelName"
        self.identity_gpu = f"{self.identity}, gpu"

    # ---- selectors -------------------------------------------------------------------------------
    def dcgm(self, metric: str, extra: str = "") -> str:
        """A DCGM series through the configured selector, with a non-empty identity."""
        more = f", {extra}" if extra else ""
        return f'{metric}{{{self.cfg.dcgm_selector}, {self.has_identity}{more}}}'

    def vllm(self, metric: str, extra: str = "") -> str:
        """A vLLM series through the configured selector, with a non-empty identity."""
        more = f", {extra}" if extra else ""
        return f'{metric}{{{self.cfg.vllm_selector}, {self.has_identity}{more}}}'

    def agent(self, metric: str, extra: str = "") -> str:
        """An application / agent series (framework allocator, training job, gpuobs agents): any job,
        non-empty identity."""
        more = f", {extra}" if extra else ""
        return f'{metric}{{{self.has_identity}{more}}}'

    def up(self, selector: str) -> str:
        return f'up{{{selector}, {self.has_identity}}}'

    def dashboard(self, path: str) -> str:
        """``<dashboard_base>/d/<path>``: a link into one of the shipped dashboards (``path`` = uid/slug?...)."""
        return f"{self.cfg.dashboard_base}/d/{path}"

    def runbook(self, file: str, alert: str) -> str:
        return runbook_url(self.cfg.runbook_base, file, alert)

    def combine(self, family: str, enhanced: str, stock: str, present: str, on: str | None = None) -> str:
        """``enhanced or (stock unless on (<on>) present)`` per the family's configured paths."""
        on = on or self.identity_gpu
        if not self.cfg.stock(family):
            return enhanced
        if not self.cfg.enhanced(family):
            return stock
        return (f"(\n{_indent(enhanced)}\n)\nor\n(\n{_indent(stock)}\n  unless on ({on})\n"
                f"  (\n{_indent(present, 4)}\n  )\n)")

    # ---- Xid -------------------------------------------------------------------------------------
    def xid_expr(self, codes: list[int]) -> str:
        I, GPU = self.identity, self.gpu_labels
        rx = "|".join(map(str, codes))
        # Xid 79 (fallen off the bus) never reaches DCGM (DCGM #162; the GPU vanishes and GpuMissing
        # pages): both DCGM paths leave it out, so a 79 seen on a DCGM series (after a recovery, or a
        # simulator) cannot page for a GPU that is back; the kernel-log path below does carry it.
        dcgm_rx = "|".join(str(c) for c in codes if c not in xid.DCGM_UNREPORTABLE_XIDS)
        gauge = self.dcgm("DCGM_FI_DEV_XID_ERRORS", f'err_code=~"{dcgm_rx}"')
        # stock: a (GPU, err_code) series (seen within the gap tolerance) that was not there in the hour
        # before the last 5 minutes, unless the whole GPU was away for that hour after being seen in the
        # 6 hours before it (an exporter back after an outage longer than the memory shows its last code
        # again and must not page it twice; a GPU never seen before, e.g. a new node, still pages).
        temp = self.dcgm("DCGM_FI_DEV_GPU_TEMP")
        returning = (f"group by ({I}, gpu) (max_over_time({temp}[6h] offset 65m))\n"
                     f"unless on ({I}, gpu)\n"
                     f"group by ({I}, gpu) (max_over_time({temp}[1h] offset 5m))")
        legacy = self.dcgm("DCGM_FI_DEV_XID_ERRORS", 'err_code=""')
        # ... and, after an upgrade from an exporter without err_code, not the code the old gauge held
        stock_errcode = (
            f'max by ({GPU}, xid) (label_replace(last_over_time({gauge}[{GAP_TOLERANCE}]), "xid", "$1", "err_code", "(.+)"))\n'
            f"unless on ({I}, gpu, xid)\n"
            f'max by ({I}, gpu, xid) (label_replace(max_over_time({gauge}[1h] offset 5m), "xid", "$1", "err_code", "(.+)"))\n'
            f"unless on ({I}, gpu, xid)\n"
            f'count_values by ({I}, gpu) ("xid", last_over_time({legacy}[1h] offset 5m))')
        # dcgm-exporter before 3.3.6 has no err_code label: the gauge's value is the last code. The code
        # becomes the xid label (count_values); the catalogue's codes are kept by renaming theirs
        # ("m48") in a copy that `unless` then cannot match; a GPU pages when its last code differs
        # from its last code 5 minutes before (a repeat of the same code is invisible there).
        codes = f'count_values by ({GPU}) ("xid", last_over_time({legacy}[{GAP_TOLERANCE}]))'
        stock_legacy = (f"(\n  {codes}\n  unless on ({I}, gpu, xid)\n"
                        f'  label_replace({codes}, "xid", "m$1", "xid", "({dcgm_rx})")\n)\n'
                        f"unless on ({I}, gpu)\n"
                        f"(\n  max by ({I}, gpu) (last_over_time({legacy}[{GAP_TOLERANCE}]))\n  ==\n"
                        f"  max by ({I}, gpu) (last_over_time({legacy}[1h] offset 5m))\n)")
        either = f"(\n{_indent(stock_errcode)}\n)\nor\n(\n{_indent(stock_legacy)}\n)"
        stock = f"(\n{_indent(either)}\n)\nunless on ({I}, gpu)\n(\n{_indent(returning)}\n)"
        count = self.dcgm("DCGM_EXP_XID_ERRORS_COUNT", f'xid=~"{dcgm_rx}"')
        enhanced = f"max by ({GPU}, xid) (max_over_time({count}[1m])) > 0"
        present = f"group by ({I}, gpu) ({self.dcgm('DCGM_EXP_XID_ERRORS_COUNT')})"
        expr = self.combine("xid", enhanced, stock, present)
        if self.cfg.xid_kernel_log:
            # gpuobs logwatch's kernel-log counters (every event, Xid 79 included): an Xid logged in the
            # last 5 minutes (gpuobs_xid_last_event_timestamp_seconds, right from the first event).
            # The GPU's identity labels come from its last DCGM series of the hour, so the alert has
            # the same labels as the DCGM paths; where logwatch runs, the DCGM paths stand aside.
            ts = self.agent("gpuobs_xid_last_event_timestamp_seconds", f'xid=~"{rx}"')
            ident = (f"topk by ({I}, gpu) (1, group by ({GPU}) "
                     f"(last_over_time({self.dcgm('DCGM_FI_DEV_GPU_TEMP')}[1h])))")
            logged = f"max by ({I}, gpu, xid) (time() - last_over_time({ts}[{GAP_TOLERANCE}]) < 300)"
            kernel = (f"(\n{_indent(logged)}\n  * on ({I}, gpu) group_left (UUID, pci_bus_id, modelName)\n"
                      f"{_indent(ident)}\n)\nor on ({I}, gpu, xid)\n{logged}")
            return f"(\n{_indent(kernel)}\n)\nor\n(\n{_indent(expr)}\n  unless on ({I})\n  {self.logwatch_reading()}\n)"
        # The kernel-log rule file (gpu-kernel-log.yml) pages Xids where logwatch reads the node's log:
        # the DCGM paths stand aside there, decided here rather than by an Alertmanager inhibition
        # (whose source must first reach a restarted Alertmanager, issue 32).
        return f"(\n{_indent(expr)}\n)\nunless on ({I})\n{self.logwatch_reading()}"

    def logwatch_reading(self) -> str:
        """The nodes whose logwatch read its kernel-log source within :data:`GAP_TOLERANCE` (one identity
        label per node): where the kernel-log path pages Xids."""
        up = self.agent("gpuobs_logwatch_source_up")
        return f"group by ({self.identity}) (max_over_time({up}[{GAP_TOLERANCE}]) == 1)"

    def xid_alert(self, name: str, codes: list[int], severity: str, summary: str) -> dict:
        return {
            "#": ("Stock: a (GPU, err_code) series of DCGM_FI_DEV_XID_ERRORS that was absent for the hour before\n"
                  "the last 5 minutes (the gauge holds the LAST code forever, so `> 0` pages forever and\n"
                  "changes() never fires): pages once per new code, and the same code coming back after an\n"
                  "exporter restart or a scrape gap does not page again; nor does an exporter back after more than\n"
                  "that hour (up to 6 h) with its old code. Enhanced (where the GPU\n"
                  "has DCGM_EXP_XID_ERRORS_COUNT): every repeat of a code within the exporter's window. Both stand\n"
                  "aside on nodes whose logwatch reads the kernel log (gpu-kernel-log.yml pages there)."),
            "alert": name,
            "expr": self.xid_expr(codes),
            "labels": {"severity": severity, "family": "xid"},
            "annotations": {
                "summary": summary,
                "description": ("GPU {{ $labels.gpu }} ({{ $labels.UUID }}, PCI {{ $labels.pci_bus_id }}) on node "
                                f"{{{{ $labels.{self.identity} }}}} reported Xid {{{{ $labels.xid }}}} in the last few minutes. "
                                "Grep the node's kernel log for 'NVRM: Xid (PCI:' and follow the runbook for this code."),
                "runbook_url": self.runbook("xid", name),
            },
        }

    def xid_file(self) -> dict:
        return {"groups": [{"name": "gpu-xid", "rules": [
            self.xid_alert("GpuXidCritical", xid.critical_codes(), "critical",
                           "A GPU reported an Xid whose NVIDIA action is reset the GPU, reboot the node or RMA."),
            self.xid_alert("GpuXidWarning", xid.ticket_codes(), "warning",
                           "A GPU reported an application-class or recoverable Xid; the owning team should look."),
        ]}]}

    # ---- GPU health --------------------------------------------------------------------------------
    def health_file(self) -> dict:
        I, GPU, IG = self.identity, self.gpu_labels, self.identity_gpu
        temp = self.dcgm("DCGM_FI_DEV_GPU_TEMP")
        energy = self.dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        dcgm_up = self.up(self.cfg.dcgm_selector)
        stock_missing = (f"group by ({GPU}) (last_over_time({temp}[1h]))\n"
                         f"unless on ({IG}) last_over_time({temp}[{GAP_TOLERANCE}])\n"
                         f"and on ({I}) (max by ({I}) ({dcgm_up}) == 1)")
        expected = self.agent("gpuobs_node_expected_gpus")
        enhanced_missing = (f"max by ({I}) ({expected})\n"
                            f"- on ({I})\n"
                            f"(\n  count by ({I}) (count by ({IG}) (last_over_time({temp}[{GAP_TOLERANCE}])))\n"
                            f"  or on ({I}) (0 * max by ({I}) ({expected}))\n)\n> 0")
        if self.cfg.paths["gpu-missing"] == "both":
            # `or on (node)`: the node-level count only where no per-GPU alert explains the deficit.
            missing = f"(\n{_indent(stock_missing)}\n)\nor on ({I})\n(\n{_indent(enhanced_missing)}\n)"
        elif self.cfg.paths["gpu-missing"] == "stock":
            missing = stock_missing
        else:
            missing = enhanced_missing
        no_identity = (f"count by (job, instance) (\n"
                       f'  DCGM_FI_DEV_GPU_TEMP{{{I}=""}}\n'
                       f'  or vllm:num_requests_running{{{I}=""}}\n'
                       f'  or up{{{self.cfg.dcgm_selector}, {I}=""}}\n'
                       f'  or up{{{self.cfg.vllm_selector}, {I}=""}}\n)')
        return {"groups": [{"name": "gpu-health", "rules": [
            {"alert": "Watchdog", "expr": "vector(1)",
             "labels": {"severity": "info", "family": "meta"},
             "annotations": {
                 "summary": "Always firing; proves the Prometheus -> Alertmanager path works.",
                 "description": "This alert fires all the time. Route it to a dead man's switch that pages when it stops arriving.",
                 "runbook_url": self.runbook("exporter", "Watchdog")}},
            {"#": ("The exporter answers but its values froze (DCGM host engine wedged): the energy counter of a\n"
                   "powered GPU always advances. count_over_time: only series with a full window of samples."),
             "alert": "GpuTelemetryStale",
             "expr": (f"max by ({GPU}) (changes({energy}[5m])) == 0\n"
                      f"and on ({IG}) max by ({IG}) (count_over_time({energy}[5m])) >= 5"),
             "for": "5m",
             "labels": {"severity": "warning", "family": "exporter"},
             "annotations": {
                 "summary": "A GPU's telemetry stopped changing although its exporter still answers.",
                 "description": (f"The energy counter of GPU {{{{ $labels.gpu }}}} on node {{{{ $labels.{I} }}}} has not "
                                 "moved for 10 minutes; DCGM or the driver is likely wedged."),
                 "runbook_url": self.runbook("exporter", "GpuTelemetryStale")}},
            {"#": "Any target the DCGM selector matches (file_sd job dcgm, or a ServiceMonitor's Service name).",
             "alert": "GpuExporterDown",
             "expr": f"{dcgm_up} == 0",
             "for": "1m",
             "labels": {"severity": "critical", "family": "exporter"},
             "annotations": {
                 "summary": "The DCGM exporter of a GPU node is not answering scrapes; its GPUs are unmonitored.",
                 "description": (f"Prometheus has failed to scrape {{{{ $labels.instance }}}} (node {{{{ $labels.{I} }}}}) "
                                 "for at least 1 minute. Either the node is down or the exporter process is."),
                 "runbook_url": self.runbook("exporter", "GpuExporterDown")}},
            {"#": ("Series that arrive without the identity label page through the degraded twins of the alerts\n"
                   "(gpu_rules.degrade: named by their instance); this ticket names the targets whose scrape config\n"
                   "does not set it, and how many there are."),
             "alert": "GpuTelemetryWithoutIdentity",
             "expr": no_identity,
             "for": "10m",
             "labels": {"severity": "warning", "family": "exporter"},
             "annotations": {
                 "summary": (f"GPU or serving telemetry arrives without the `{I}` label; its alerts name the scrape "
                             "target instead of the node."),
                 "description": (f"Target {{{{ $labels.instance }}}} (job {{{{ $labels.job }}}}) serves DCGM or vLLM series "
                                 f"without a `{I}` label ({{{{ with query `count({_oneline(no_identity)})` }}}}"
                                 "{{ . | first | value }}{{ end }} such target(s) in all). Its per-target alerts still "
                                 "fire, named by the target (label identity_source=\"instance\"); alerts that join "
                                 "it with another job's series (the kernel-log Xid path, serving, KV cache, SLO "
                                 "burn) cannot. Add the relabelling from README 'Pointing it at a real fleet' "
                                 "(e.g. from __meta_kubernetes_pod_node_name) and run `gpuobs doctor`."),
                 "runbook_url": self.runbook("exporter", "GpuTelemetryWithoutIdentity")}},
            {"#": ("Stock: a (node, gpu) that reported DCGM_FI_DEV_GPU_TEMP within the last hour and reports nothing\n"
                   "now while the node's DCGM target is up (DCGM cannot report Xid 79: the GPU just vanishes). Per\n"
                   "GPU index, so MIG re-partitioning (new instance series) and exporter restarts (new instance or\n"
                   "pod labels; no target while it restarts) do not fire it, and it names WHICH GPU. A GPU counts as\n"
                   f"present for {GAP_TOLERANCE} after its last sample (no `for:`): a re-partition or restart gap up to\n"
                   f"that long never pages, and a GPU truly gone pages {GAP_TOLERANCE} + one scrape and evaluation after\n"
                   "its last sample. Enhanced:\n"
                   "gpuobs_node_expected_gpus, which also sees a GPU missing since boot (node-level, no gpu label);\n"
                   "used only when no per-GPU alert explains the node's deficit."),
             "alert": "GpuMissing",
             "expr": missing,
             "labels": {"severity": "critical", "family": "gpu-missing"},
             "annotations": {
                 "summary": "A GPU has disappeared from a node's DCGM page (fallen off the bus or driver lost it).",
                 "description": (f"Node {{{{ $labels.{I} }}}}: {{{{ if $labels.gpu }}}}GPU {{{{ $labels.gpu }}}} "
                                 "({{ $labels.UUID }}, PCI {{ $labels.pci_bus_id }}) reported within the last hour and "
                                 "is gone now{{ else }}{{ $value }} GPU(s) fewer than the node should have{{ end }}. "
                                 "Check the kernel log for 'NVRM: Xid' 79 and `nvidia-smi -L` on the node."),
                 "runbook_url": self.runbook("xid", "GpuMissing")}},
        ]}]}

    # ---- GPU hardware ------------------------------------------------------------------------------
    def hardware_file(self) -> dict:
        I, GPU, IG = self.identity, self.gpu_labels, self.identity_gpu
        bits_raw = (f'max by ({GPU}) ({{__name__=~"{"|".join(CLOCK_EVENT_FIELDS)}", '
                    f'{self.cfg.dcgm_selector}, {self.has_identity}}})')
        bits = " + ".join(f"(floor({bits_raw} / {b}) % 2)" for _, b in THROTTLE_BITS)
        clock = self.dcgm("DCGM_FI_DEV_SM_CLOCK")
        power = self.dcgm("DCGM_FI_DEV_POWER_USAGE")
        thermal_v, power_v = self.dcgm("DCGM_FI_DEV_THERMAL_VIOLATION"), self.dcgm("DCGM_FI_DEV_POWER_VIOLATION")
        # `and` the counters' presence now: a GPU gone from the page (fallen off the bus) stops at once.
        viol = (f"max by ({GPU}) (rate({thermal_v}[2m]) + rate({power_v}[2m])) / 1e9\n"
                f"and on ({IG}) {thermal_v}")
        # Power-violation time is a fault only when the limit is enforced from outside or by protection
        # (HW_POWER_BRAKE / HW_SLOWDOWN set now), or the power collapsed under POWER_COLLAPSE_RATIO of its
        # 1h maximum (a brake without the bits, or a limit cut far below what the GPU drew): a healthy GPU
        # at its configured power cap under dense load accrues it too (SW_POWER_CAP), keeping its power.
        fault_bits = " + ".join(f"(floor({bits_raw} / {b}) % 2)" for _, b in POWER_FAULT_BITS)
        power_fault = (f"max by ({IG}) ({fault_bits}) > 0\n"
                       f"or on ({IG})\n"
                       f"max by ({IG}) ({power}) < {POWER_COLLAPSE_RATIO} * max by ({IG}) (max_over_time({power}[1h]))")
        fault_viol = (f"max by ({GPU}) (\n"
                      f"  rate({thermal_v}[2m])\n"
                      f"  + (\n"
                      f"    (rate({power_v}[2m]) and on ({IG}) (\n{_indent(power_fault, 6)}\n    ))\n"
                      f"    or rate({power_v}[2m]) * 0\n"
                      f"  )\n"
                      f") / 1e9\n"
                      f"and on ({IG}) {thermal_v}")
        enhanced_thr = ("gpu:dcgm_fault_throttled_time:ratio_rate2m > 0.25\n"
                        f"unless on ({IG}) gpu:dcgm_clocks_event_thermal_or_power:bool == 0")
        hot = self.cfg.slowdown_temp_c - SLOWDOWN_BAND_C
        stock_thr = (f"max by ({GPU}) ({clock}) / max by ({GPU}) (max_over_time({clock}[1h])) < {THROTTLE_CLOCK_RATIO}\n"
                     f"and on ({IG}) (\n"
                     f"  max by ({IG}) ({self.dcgm('DCGM_FI_DEV_GPU_UTIL')}) >= {BUSY_UTIL_PCT}\n"
                     f"  or on ({IG}) max by ({IG}) ({self.dcgm('DCGM_FI_PROF_GR_ENGINE_ACTIVE')}) >= {BUSY_UTIL_PCT / 100}\n)\n"
                     f"and on ({IG}) (\n"
                     f"  max by ({IG}) (max_over_time({self.dcgm('DCGM_FI_DEV_GPU_TEMP')}[2m])) >= {hot:g}\n"
                     f"  or on ({IG})\n"
                     f"  max by ({IG}) ({power}) < {POWER_COLLAPSE_RATIO} * max by ({IG}) (max_over_time({power}[1h]))\n)")
        present_thr = (f"group by ({IG}) ({self.dcgm('DCGM_FI_DEV_THERMAL_VIOLATION')} "
                       f"or {self.dcgm('DCGM_FI_DEV_POWER_VIOLATION')})")
        rows = self.dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")
        dbe = self.combine("ecc", f"max by ({GPU}) (increase({self.dcgm('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL')}[10m])) > 0",
                           f"max by ({GPU}) (increase({rows}[10m])) > 0",
                           f"group by ({IG}) ({self.dcgm('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL')})")
        pending = self.combine("ecc", f"max by ({GPU}) ({self.dcgm('DCGM_FI_DEV_ROW_REMAP_PENDING')}) == 1",
                               f"max by ({GPU}) (increase({rows}[10m])) > 0\n"
                               f"unless on ({IG}) max by ({IG}) ({self.dcgm('DCGM_FI_DEV_ROW_REMAP_FAILURE')}) == 1",
                               f"group by ({IG}) ({self.dcgm('DCGM_FI_DEV_ROW_REMAP_PENDING')})")
        dash = self.dashboard("gpuobs-fleet/gpu-fleet?viewPanel=")
        return {"groups": [
            {"name": "gpu-hardware-recording", "rules": [
                {"#": ("Fraction of wall time the GPU spent clock-limited by thermal or power constraints (DCGM\n"
                       "violation counters are in ns: rate / 1e9 = fraction of each second). Enhanced fields. Includes\n"
                       "time at the configured power cap (SW_POWER_CAP), normal under dense load: capacity, not a fault."),
                 "record": "gpu:dcgm_throttled_time:ratio_rate2m", "expr": viol},
                {"#": ("The part of it that is a fault, what GPUThrottling reads: all thermal-violation time, plus\n"
                       "power-violation time only while HW_POWER_BRAKE 0x80 or HW_SLOWDOWN 0x8 is set or the power\n"
                       f"collapsed under {POWER_COLLAPSE_RATIO:g}x its 1h maximum (a power brake). A GPU at its power cap under dense\n"
                       "load (SW_POWER_CAP 0x4, power at the cap) counts power-violation time but is not throttled by a fault."),
                 "record": "gpu:dcgm_fault_throttled_time:ratio_rate2m", "expr": fault_viol},
                {"#": ("1 when a thermal or power clock-event bit is set now: SW_POWER_CAP 0x4, HW_SLOWDOWN 0x8,\n"
                       "SW_THERMAL 0x20, HW_THERMAL 0x40, HW_POWER_BRAKE 0x80 (PromQL has no bitwise AND: test bits\n"
                       "with floor(x / bit) % 2). The field under either name: DCGM_FI_DEV_CLOCKS_EVENT_REASONS or\n"
                       "its legacy DCGM_FI_DEV_CLOCK_THROTTLE_REASONS."),
                 "record": "gpu:dcgm_clocks_event_thermal_or_power:bool", "expr": f"{bits} > bool 0"},
            ]},
            {"name": "gpu-hardware", "rules": [
                {"#": ("Throttling is the symptom that costs throughput; temperature alone is not, nor is a GPU at\n"
                       "its configured power cap. Enhanced: the violation counters say > 25 % of the time was\n"
                       "clock-limited by a fault (thermal time; power time only with the HW power brake / HW slowdown\n"
                       "bits or the power collapsed: gpu:dcgm_fault_throttled_time:ratio_rate2m) and the clock-event\n"
                       f"bits (when present) agree. Stock: the SM clock under {THROTTLE_CLOCK_RATIO:g}x its 1h maximum while busy, with the\n"
                       f"temperature at the slowdown point (>= {self.cfg.slowdown_temp_c:g} - {SLOWDOWN_BAND_C} C) or the power collapsed (power brake); a GPU\n"
                       "merely at its power cap under dense load keeps its power and its temperature under the\n"
                       "slowdown point, and is not a ticket. The value is the throttled fraction (enhanced) or the\n"
                       "SM clock as a fraction of its 1h maximum (stock)."),
                 "alert": "GPUThrottling",
                 "expr": self.combine("throttling", enhanced_thr, stock_thr, present_thr),
                 "for": "2m",
                 "labels": {"severity": "warning", "family": "throttling"},
                 "annotations": {
                     "summary": "A GPU is losing clock to thermal or power limits.",
                     "description": (f"GPU {{{{ $labels.gpu }}}} on node {{{{ $labels.{I} }}}} is clock-limited by thermal or power "
                                     "limits ({{ $value | humanizePercentage }}, the time throttled by heat or a power brake per the violation counters, or "
                                     "the SM clock against its 1h maximum on a stock exporter). Its node's latency rises with the lost clock."),
                     "runbook_url": self.runbook("throttling", "GPUThrottling"),
                     "dashboard_url": dash + "6"}},
                {"#": ("Enhanced: double-bit ECC counter increases. Stock: uncorrectable remapped rows rising (each\n"
                       "uncorrectable error remaps a row); Xid 48/63/64 page or ticket through the Xid alerts."),
                 "alert": "GpuEccDoubleBitError",
                 "expr": dbe,
                 "labels": {"severity": "critical", "family": "ecc"},
                 "annotations": {
                     "summary": "A GPU reported uncorrectable (double-bit) ECC errors; its results can be corrupt.",
                     "description": (f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.UUID }}}}) on node {{{{ $labels.{I} }}}} counted "
                                     "{{ $value }} new uncorrectable ECC error(s) or remapped row(s) in 10 minutes. Drain and reset the GPU."),
                     "runbook_url": self.runbook("ecc", "GpuEccDoubleBitError"),
                     "dashboard_url": dash + "7"}},
                {"alert": "GpuRowRemapFailure",
                 "expr": f"max by ({GPU}) ({self.dcgm('DCGM_FI_DEV_ROW_REMAP_FAILURE')}) == 1",
                 "labels": {"severity": "critical", "family": "ecc"},
                 "annotations": {
                     "summary": "Row remapping failed on a GPU; the memory fault cannot be repaired in place (RMA path).",
                     "description": (f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.UUID }}}}) on node {{{{ $labels.{I} }}}} "
                                     "reports a row-remap failure."),
                     "runbook_url": self.runbook("ecc", "GpuRowRemapFailure"),
                     "dashboard_url": dash + "7"}},
                {"#": ("A remap recorded for an uncorrectable error activates at the next GPU reset: schedule one.\n"
                       "Enhanced: DCGM_FI_DEV_ROW_REMAP_PENDING (state; resolves when the reset applies the remap).\n"
                       "Stock proxy: the DBE's own signal (uncorrectable remapped rows rose within 10 minutes, and the remap\n"
                       "did not fail); it fires with the DBE page, which inhibits it: on a stock exporter the pending state\n"
                       "cannot be told from the DBE itself, and the DBE page already says to reset the GPU."),
                 "alert": "GpuRowRemapPending",
                 "expr": pending,
                 "for": "1m",
                 "labels": {"severity": "warning", "family": "ecc"},
                 "annotations": {
                     "summary": "A GPU remapped memory rows for an uncorrectable error; reset it at the next window.",
                     "description": (f"GPU {{{{ $labels.gpu }}}} on node {{{{ $labels.{I} }}}} has a row remap pending "
                                     "(or rows remapped in the last 10 minutes); the next GPU reset applies it."),
                     "runbook_url": self.runbook("ecc", "GpuRowRemapPending"),
                     "dashboard_url": dash + "7"}},
                {"#": "Enhanced only: NVLink error counters are commented out in every shipped counters CSV.",
                 "alert": "GpuNvlinkErrors",
                 "expr": f"max by ({GPU}) (rate({self.dcgm('DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL')}[5m])) > 1",
                 "for": "5m",
                 "labels": {"severity": "warning", "family": "interconnect"},
                 "annotations": {
                     "summary": "NVLink CRC errors are accumulating on a GPU (link degrading; collectives slow down).",
                     "description": (f"GPU {{{{ $labels.gpu }}}} on node {{{{ $labels.{I} }}}} counts "
                                     "{{ $value | humanize }} NVLink CRC flit errors/s."),
                     "runbook_url": self.runbook("interconnect", "GpuNvlinkErrors")}},
                {"alert": "GpuPcieReplays",
                 "expr": f"max by ({GPU}) (rate({self.dcgm('DCGM_FI_DEV_PCIE_REPLAY_COUNTER')}[5m])) > 1",
                 "for": "5m",
                 "labels": {"severity": "warning", "family": "interconnect"},
                 "annotations": {
                     "summary": "PCIe replays are accumulating on a GPU (bad riser, slot or link).",
                     "description": (f"GPU {{{{ $labels.gpu }}}} on node {{{{ $labels.{I} }}}} replays "
                                     "{{ $value | humanize }} PCIe packets/s."),
                     "runbook_url": self.runbook("interconnect", "GpuPcieReplays")}},
            ]},
        ]}

    # ---- memory ------------------------------------------------------------------------------------
    def memory_file(self) -> dict:
        # Alert labels (node, gpu, UUID): what both the allocator's and DCGM's series carry, so the two paths
        # raise the same alert.
        I, IG = self.identity, self.identity_gpu
        J = GPU = f"{I}, gpu, UUID"
        reserved = self.agent("pytorch_cuda_memory_reserved_bytes")
        allocated = self.agent("pytorch_cuda_memory_allocated_bytes")
        fb_used, fb_free = self.dcgm("DCGM_FI_DEV_FB_USED"), self.dcgm("DCGM_FI_DEV_FB_FREE")
        enhanced = (f"max by ({GPU}) (gpu:pytorch_cuda_fragmentation:deriv10m) > {GROWTH_BYTES_PER_S}\n"
                    f"and on ({IG}) max by ({IG}) (abs(gpu:pytorch_cuda_memory_allocated:deriv10m)) < 104857.6\n"
                    f"and on ({IG})\n(\n"
                    f"  max by ({IG}) (increase({self.agent('pytorch_cuda_alloc_retries_total')}[15m])) > 0\n"
                    f"  or on ({IG}) max by ({IG}) (gpu:pytorch_cuda_time_to_oom:seconds) < 14400\n)")
        stock = (f"max by ({GPU}) (deriv({fb_used}[10m])) * {MIB} > {GROWTH_BYTES_PER_S}\n"
                 f"and on ({IG})\n"
                 f"max by ({IG}) (predict_linear({fb_used}[30m], 14400))\n"
                 f">= on ({IG}) max by ({IG}) ({fb_used} + {fb_free})")
        present = f"group by ({IG}) ({reserved})"
        return {"groups": [
            {"name": "gpu-memory-recording", "rules": [
                {"record": "gpu:pytorch_cuda_fragmentation:bytes", "expr": f"{reserved} - {allocated}"},
                {"record": "gpu:pytorch_cuda_fragmentation:deriv10m",
                 "expr": "deriv(gpu:pytorch_cuda_fragmentation:bytes[10m])"},
                {"record": "gpu:pytorch_cuda_memory_allocated:deriv10m", "expr": f"deriv({allocated}[10m])"},
                {"#": ("Seconds until reserved memory reaches the framebuffer (DCGM FB free + used, MiB -> bytes) at\n"
                       "the last 30 minutes' trend; absent when reserved is not growing. The sum folds a MIG GPU's\n"
                       "per-instance FB series into one per GPU (the allocator reports per GPU). The max folds the\n"
                       "old and new series of a relabelled target (rollout track, replaced pod), which the 30m range\n"
                       "holds side by side: without it the whole rule fails (many-to-many) for 30 minutes."),
                 "record": "gpu:pytorch_cuda_time_to_oom:seconds",
                 "expr": (f"(\n  sum by ({J}) ({fb_free} + {fb_used}) * {MIB}\n"
                          f"  - on ({J}) max by ({J}) ({reserved})\n)\n"
                          f"/ on ({J}) (max by ({J}) (deriv({reserved}[30m])) > 0)")},
            ]},
            {"name": "gpu-memory", "rules": [
                {"#": ("Enhanced (framework allocator metrics, docs/metrics.md): the caching allocator's reserved-minus-\n"
                       "allocated gap grows while allocated memory is flat, with alloc retries or a projected OOM\n"
                       "within 4 h. Stock (DCGM only): FB used grows and heads for the framebuffer's capacity within\n"
                       "4 h (predict_linear). The value is the growth in bytes/s. FB_* are absent on H100 MIG instances."),
                 "alert": "KVFragmentationRisk",
                 "expr": self.combine("memory", enhanced, stock, present),
                 "for": "5m",
                 "labels": {"severity": "warning", "family": "fragmentation"},
                 "annotations": {
                     "summary": ("GPU memory is heading for out-of-memory: the allocator's reserved-minus-allocated gap grows "
                                 "while allocated memory is flat (fragmentation), or FB used grows towards capacity."),
                     "description": (f"GPU {{{{ $labels.gpu }}}} on node {{{{ $labels.{I} }}}}: memory grows "
                                     "{{ $value | humanize1024 }}B/s (fragmentation gap with allocated flat, or DCGM FB used) "
                                     "and alloc retries are rising or memory reaches the framebuffer within 4 h. Restart "
                                     "the engine in a quiet window (drain first) before it OOMs."),
                     "runbook_url": self.runbook("fragmentation", "KVFragmentationRisk"),
                     "dashboard_url": self.dashboard("gpuobs-memory/gpu-memory?viewPanel=2")}},
                {"alert": "GpuFrameworkOom",
                 "expr": f"max by ({GPU}) (increase({self.agent('pytorch_cuda_ooms_total')}[10m])) > 0",
                 "labels": {"severity": "warning", "family": "fragmentation"},
                 "annotations": {
                     "summary": "The framework allocator raised out-of-memory on a GPU (requests failed, engine may restart).",
                     "description": (f"GPU {{{{ $labels.gpu }}}} on node {{{{ $labels.{I} }}}} raised {{{{ $value }}}} "
                                     "OOM(s) in 10 minutes."),
                     "runbook_url": self.runbook("fragmentation", "GpuFrameworkOom"),
                     "dashboard_url": self.dashboard("gpuobs-memory/gpu-memory?viewPanel=2")}},
            ]},
        ]}

    # ---- serving -----------------------------------------------------------------------------------
    def serving_file(self) -> dict:
        I = self.identity
        E = f"{I}, instance, model_name, engine"
        errors = self.vllm("vllm:request_success_total", 'finished_reason="error"')
        return {"groups": [
            {"name": "serving-recording", "rules": [
                {"#": ("Energy per generated token on each serving node: GPU power (W = J/s) over tokens/s = J/token,\n"
                       f"joined on `{I}`. `max by ({I}, UUID)` counts a MIG-partitioned GPU once."),
                 "record": f"{I}:vllm_energy_per_generated_token:joules_rate5m",
                 "expr": (f"sum by ({I}) (max by ({I}, UUID) (avg_over_time({self.dcgm('DCGM_FI_DEV_POWER_USAGE')}[5m])))\n"
                          f"/ sum by ({I}) (rate({self.vllm('vllm:generation_tokens_total')}[5m]))")},
                {"record": f"{I}:vllm_request_errors:ratio_rate5m",
                 "expr": (f"sum by ({I}) (rate({errors}[5m]))\n"
                          f"/ sum by ({I}) (rate({self.vllm('vllm:request_success_total')}[5m]))")},
                {"record": f"{I}:vllm_time_to_first_token_seconds:p99_rate5m",
                 "expr": (f"histogram_quantile(0.99, sum by ({I}, le) "
                          f"(rate({self.vllm('vllm:time_to_first_token_seconds_bucket')}[5m])))")},
            ]},
            {"name": "serving", "rules": [
                {"#": (f"Per engine ({E}): one engine's preemptions never count against another's full cache,\n"
                       "and a missing identity never joins (every series needs it)."),
                 "alert": "ServingKVCachePressure",
                 "expr": (f"max by ({E}) (avg_over_time({self.vllm('vllm:kv_cache_usage_perc')}[2m])) > 0.95\n"
                          f"and on ({E}) max by ({E}) (rate({self.vllm('vllm:num_preemptions_total')}[2m])) > 0"),
                 "for": "2m",
                 "labels": {"severity": "warning", "family": "kv-cache"},
                 "annotations": {
                     "summary": "A serving engine's KV cache is full and it is preempting requests (latency rises, queue grows).",
                     "description": (f"Node {{{{ $labels.{I} }}}}, engine {{{{ $labels.engine }}}} ({{{{ $labels.model_name }}}}, "
                                     "{{ $labels.instance }}): KV-cache usage {{ $value | humanizePercentage }} with preemptions "
                                     "rising. Add replicas, lower max_num_seqs / max_model_len, or shed long-context traffic."),
                     "runbook_url": self.runbook("kv-cache", "ServingKVCachePressure"),
                     "dashboard_url": self.dashboard("gpuobs-serving/serving-slos?viewPanel=8")}},
                {"#": ("Not while the node's DCGM exporter is down too: that is the node, and GpuExporterDown pages for it.\n"
                       "In the rule, not only as an inhibition: both fire after the same `for:`, and an inhibition\n"
                       "only holds if its source reaches Alertmanager before the target's group is flushed."),
                 "alert": "ServingEngineDown",
                 "expr": (f"{self.up(self.cfg.vllm_selector)} == 0\n"
                          f"unless on ({I}) ({self.up(self.cfg.dcgm_selector)} == 0)"),
                 "for": "1m",
                 "labels": {"severity": "critical", "family": "exporter"},
                 "annotations": {
                     "summary": "A serving engine's metrics endpoint is not answering.",
                     "description": (f"Prometheus has failed to scrape {{{{ $labels.instance }}}} (node {{{{ $labels.{I} }}}}) "
                                     "for 1 minute."),
                     "runbook_url": self.runbook("exporter", "ServingEngineDown")}},
            ]},
        ]}

    # ---- training ----------------------------------------------------------------------------------
    def training_file(self) -> dict:
        I = self.identity
        util = self.dcgm("DCGM_FI_DEV_GPU_UTIL")
        power = self.dcgm("DCGM_FI_DEV_POWER_USAGE")
        tensor = self.dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
        sm = self.dcgm("DCGM_FI_PROF_SM_ACTIVE")
        steps = self.agent("training_steps_total")
        enhanced = (f"max by ({I}, training_job) (avg by ({I}, training_job) ({self.agent('training_mfu_ratio')}) < 0.05)\n"
                    f"and on ({I}) avg by ({I}) ({util}) > 90\n"
                    f"and on ({I}) avg by ({I}) ({sm}) < 0.1\n"
                    f"and on ({I}) avg by ({I}) ({power}) < 200\n"
                    f"and on ({I}) max by ({I}) (increase({steps}[2m])) == 0")
        stock = (f"avg by ({I}) ({util}) > 90\n"
                 f"and on ({I}) avg by ({I}) ({tensor}) < 0.05\n"
                 f"and on ({I}) avg by ({I}) ({power}) < {POWER_COLLAPSE_RATIO} * avg by ({I}) (max_over_time({power}[30m]))\n"
                 f"and on ({I}) avg by ({I}) (max_over_time({tensor}[30m])) > 0.3")
        present = f"group by ({I}) ({sm}) and on ({I}) group by ({I}) ({steps})"
        return {"groups": [
            {"name": "training-recording", "rules": [
                {"record": "training_job:training_mfu:avg", "expr": "avg by (training_job) (training_mfu_ratio)"},
                {"record": "rank:training_step_duration_seconds:mean5m",
                 "expr": "rate(training_step_duration_seconds_sum[5m]) / rate(training_step_duration_seconds_count[5m])"},
                {"record": "training_job:training_step_duration_seconds:median_of_ranks5m",
                 "expr": "quantile by (training_job) (0.5, rank:training_step_duration_seconds:mean5m)"},
            ]},
            {"name": "training", "rules": [
                {"#": ("DCGM_FI_DEV_GPU_UTIL only says a kernel is resident; a hung NCCL kernel spinning on a flag\n"
                       "keeps it near 100 % while the SMs do no work and power drops. Enhanced (SM_ACTIVE and the\n"
                       "job's step counter on the node): MFU ~0, SM active < 10 %, power < 200 W, no step in 2 minutes.\n"
                       "Stock: GPU_UTIL > 90 % while tensor-pipe activity is ~0 and power fell under half its 30m\n"
                       "maximum on a node whose tensor pipes were busy in the last 30 minutes (training_job empty)."),
                 "alert": "TrainingCollectiveHang",
                 "expr": self.combine("collective-hang", enhanced, stock, present, on=I),
                 "for": "2m",
                 "labels": {"severity": "critical", "family": "training"},
                 "annotations": {
                     "summary": "A training job is hung in a collective (GPU util ~100 % but SMs idle, power low, no steps).",
                     "description": (f"{{{{ if $labels.training_job }}}}{{{{ $labels.training_job }}}} on {{{{ end }}}}node "
                                     f"{{{{ $labels.{I} }}}}: GPU utilisation reads >90 % while the SMs (or tensor pipes) are "
                                     "idle, power collapsed and no step completes. Dump NCCL state and restart the job from "
                                     "its last checkpoint."),
                     "runbook_url": self.runbook("collective-hang", "TrainingCollectiveHang"),
                     "dashboard_url": self.dashboard("gpuobs-training/training?viewPanel=1")}},
                {"alert": "TrainingStraggler",
                 "expr": ("rank:training_step_duration_seconds:mean5m\n> on (training_job) group_left\n"
                          "1.3 * training_job:training_step_duration_seconds:median_of_ranks5m"),
                 "for": "3m",
                 "labels": {"severity": "warning", "family": "training"},
                 "annotations": {
                     "summary": "One training rank is much slower than the job's median; every other rank waits for it.",
                     "description": (f"Rank {{{{ $labels.rank }}}} (GPU {{{{ $labels.gpu }}}} on node {{{{ $labels.{I} }}}}) takes "
                                     "{{ $value | humanizeDuration }} per step, over 1.3x the job median."),
                     "runbook_url": self.runbook("straggler", "TrainingStraggler"),
                     "dashboard_url": self.dashboard("gpuobs-training/training?viewPanel=2")}},
            ]},
        ]}

    # ---- fleet -------------------------------------------------------------------------------------
    def fleet_file(self) -> dict:
        I = self.identity
        temp = self.dcgm("DCGM_FI_DEV_GPU_TEMP", 'DCGM_FI_DRIVER_VERSION!=""')
        return {"groups": [{"name": "fleet", "rules": [
            {"#": ("A pool (GPU model) should run one driver; two means an upgrade stalled half way or a node was\n"
                   "rebuilt from the wrong image. Needs the DCGM_FI_DRIVER_VERSION label, which the dcgm-exporter\n"
                   "Helm chart's metrics ConfigMap drops: blind there until that CSV line is restored."),
             "alert": "GpuDriverSkew",
             "expr": (f"count by (modelName) (count by (modelName, DCGM_FI_DRIVER_VERSION) "
                      f"({temp})) > 1"),
             "for": "10m",
             "labels": {"severity": "warning", "family": "driver-skew"},
             "annotations": {
                 "summary": "More than one NVIDIA driver version runs in a GPU pool.",
                 "description": ("{{ $value }} driver versions run on {{ $labels.modelName }} nodes. List them with "
                                 f"`count by (DCGM_FI_DRIVER_VERSION, {I}) (DCGM_FI_DEV_GPU_TEMP)` and finish or roll back the upgrade."),
                 "runbook_url": self.runbook("driver-skew", "GpuDriverSkew"),
                 "dashboard_url": self.dashboard("gpuobs-fleet/gpu-fleet?viewPanel=1")}},
        ]}]}


def degrade(main: dict, fallback: dict, cfg: FleetConfig) -> dict:
    """``main`` (a rule file as built by :class:`Rules`) with every alert that can degrade extended by
    its twin from ``fallback`` (the same file built with ``Rules(cfg, fallback=True)``): ``main or
    <twin>``, the twin's identity label set to its target's ``instance`` and marked
    ``identity_source="instance"``, its description saying so and how to fix it. Alerts in
    :data:`NEVER_DEGRADED` and alerts that read a recording rule keep ``main``'s expression."""
    I = cfg.identity_label
    note = ("{{ if $labels.identity_source }} IDENTITY DEGRADED: this target's series lack the `%s` label, so "
            "the alert names the scrape target (instance) instead of the node; add the relabelling from "
            "README 'Pointing it at a real fleet' and run `gpuobs doctor`.{{ end }}" % I)
    out = {"groups": []}
    for g_main, g_fb in zip(main["groups"], fallback["groups"], strict=True):
        rules = []
        for r, fb in zip(g_main["rules"], g_fb["rules"], strict=True):
            if "alert" in r and r["alert"] not in NEVER_DEGRADED and not _RECORDED.search(fb["expr"]) \
                    and f'{I}="", {FALLBACK_IDENTITY}!=""' in fb["expr"]:
                twin = (f'label_replace(\n  label_replace(\n{_indent(fb["expr"], 4)}\n  , "{I}", "$1", '
                        f'"{FALLBACK_IDENTITY}", "(.+)"),\n  "identity_source", "{FALLBACK_IDENTITY}", "", "")')
                r = {**r, "expr": f"(\n{_indent(r['expr'])}\n)\nor\n{twin}",
                     "annotations": {**r["annotations"], "description": r["annotations"]["description"] + note}}
            rules.append(r)
        out["groups"].append({**g_main, "rules": rules})
    return out


def _oneline(expr: str) -> str:
    """``expr`` on one line (for a template's query)."""
    return " ".join(part.strip() for part in expr.splitlines())


def _indent(text: str, n: int = 2) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


#: Rule file name -> (header comment, builder).
FILES = {
    "gpu-xid.yml": ("Xid alerts; code lists from gpuobs/reference/data/xid_catalog.csv (critical = reset GPU /\n"
                    "reboot node / RMA; warning = the rest plus the ticketed codes 63, 92, 94, 13, 31, 43, 45, 68).",
                    Rules.xid_file),
    "gpu-health.yml": ("GPU fleet health: exporter reachability and identity, GPUs missing from the DCGM page, stale\n"
                       "telemetry, and the Watchdog (dead man's switch).", Rules.health_file),
    "gpu-hardware.yml": ("GPU hardware health: ECC, row remapping, NVLink, PCIe and throttling. Page on imminent loss\n"
                         "of hardware (uncorrectable errors, failed remap); ticket on causes.", Rules.hardware_file),
    "gpu-memory.yml": ("GPU memory: the framework allocator's fragmentation (docs/metrics.md) if it is instrumented,\n"
                       "DCGM's framebuffer trend otherwise.", Rules.memory_file),
    "serving.yml": ("Serving engine signals (vLLM V1 names) other than the SLOs (slo.yml).", Rules.serving_file),
    "training.yml": ("Training jobs: MFU, stragglers, and the collective hang where GPU utilisation lies.",
                     Rules.training_file),
    "fleet.yml": ("Fleet consistency.", Rules.fleet_file),
}
