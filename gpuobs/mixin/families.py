"""The alert families gpuobs ships and the signals each needs: the contract between the rules
(``prometheus/rules/*.yml``, rendered by :mod:`gpuobs.mixin`), ``gpuobs doctor`` (which reads a live
Prometheus and says, per family, whether it is live, degraded or blind there) and the runbooks.

A family has a *stock* path (fields NVIDIA's dcgm-exporter 4.x serves with etc/default-counters.csv,
or the GPU Operator's dcp-metrics-included.csv, which enables the same set) and, where richer fields
exist, an *enhanced* path (fields commented out in those CSVs, or not in them at all, which
``deploy/dcgm-exporter/recommended.csv`` enables; or application / gpuobs agent metrics). The rules
combine both so the best available signal wins and nothing pages twice. Design §4.1, §4.6, §6.

Status, as ``gpuobs doctor`` reports it:

* live: the enhanced signals are present (or the family has no enhanced path and the stock ones are);
* degraded: only the stock path works (it pages, with less precision or later);
* blind: neither path has its series; for a ``paging`` family that is an error (doctor exits 1).
"""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Signal:
    """A series a path needs: ``metric`` (a metric name) on ``job`` (``dcgm``, ``vllm``, ``app``: the
    framework or training job, ``agent``: gpuobs's node agents), and how to enable it when missing.

    ``sparse``: the exporter serves the series only after an event (the Xid gauge of dcgm-exporter
    4.4+ is absent until the first Xid), so its absence on a healthy fleet is not evidence that the
    field is disabled; ``gpuobs doctor`` presumes it when the target serves the default field set."""

    metric: str
    job: str = "dcgm"
    enable: str = ""
    sparse: bool = False


@dataclass(frozen=True)
class Family:
    """One alert family: its alerts, whether it pages, and the signals of its stock and enhanced paths.

    ``alternatives``: signals any one of which satisfies the enhanced path (e.g. the clock-event field
    under its legacy name). ``blind_on_stock``: the family has no stock path at all (say why in
    ``note``). ``needs_driver_label``: the family reads the ``DCGM_FI_DRIVER_VERSION`` label.
    ``identity_join``: none of the family's alerts can fire for a target without the identity label
    (they read recording rules grouped by it, or join across jobs on it), so such a target is blind for
    the family; the other families' alerts page it degraded, named by its ``instance``
    (:func:`gpuobs.mixin.gpu_rules.degrade`; tests/mixin/test_render.py checks the two agree).
    ``fleet_wide``: the family's rules aggregate over the fleet and read no identity label (the SLOs, per
    model), so a target without it loses nothing there.
    ``optional``: signals only some of the family's alerts read (e.g. ServingEngineDown's ``up`` of
    the vLLM targets); without them the family is degraded, never blind."""

    name: str
    alerts: tuple[str, ...]
    paging: bool
    stock: tuple[Signal, ...] = ()
    enhanced: tuple[Signal, ...] = ()
    alternatives: tuple[Signal, ...] = ()
    blind_on_stock: bool = False
    needs_driver_label: bool = False
    identity_join: bool = False
    fleet_wide: bool = False
    optional: tuple[Signal, ...] = ()
    runbook: str = ""
    note: str = ""


CSV = "add to the dcgm-exporter counters CSV (deploy/dcgm-exporter/recommended.csv has the line)"
APP = "instrument the framework (PyTorch allocator metrics, docs/metrics.md)"

FAMILIES: tuple[Family, ...] = (
    Family("xid", ("GpuXidCritical", "GpuXidWarning", "GpuKernelXidCritical", "GpuKernelXidWarning",
                   "GpuKernelXidRepeated"), True,
           stock=(Signal("DCGM_FI_DEV_XID_ERRORS", sparse=True),),
           enhanced=(Signal("DCGM_EXP_XID_ERRORS_COUNT", enable=CSV),),
           # logwatch reading its source is the kernel-log path's signal: gpuobs_xid_events_total exists
           # only after a node's first Xid, so keying on it called a watched, healthy node unwatched.
           alternatives=(Signal("gpuobs_logwatch_source_up", "agent", "run `gpuobs logwatch` on every GPU node"),),
           runbook="xid.md",
           note="stock: a (GPU, err_code) series that was not there minutes ago (the gauge holds the last code); "
                "enhanced: repeats of a code within the exporter's window, or every kernel-log Xid"),
    Family("gpu-missing", ("GpuMissing", "GpuFallenOffBus"), True,
           stock=(Signal("DCGM_FI_DEV_GPU_TEMP"),),
           enhanced=(Signal("gpuobs_node_expected_gpus", "agent", "run the gpuobs NVML exporter or logwatch"),),
           alternatives=(Signal("gpuobs_gpu_fallen_off_bus", "agent", "run `gpuobs logwatch` on every GPU node"),),
           runbook="xid.md",
           note="stock: fewer GPUs reporting than the node had in the last hour (DCGM cannot report Xid 79)"),
    Family("ecc", ("GpuEccDoubleBitError", "GpuRowRemapFailure", "GpuRowRemapPending"), True,
           stock=(Signal("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), Signal("DCGM_FI_DEV_ROW_REMAP_FAILURE")),
           enhanced=(Signal("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", enable=CSV),
                     Signal("DCGM_FI_DEV_ROW_REMAP_PENDING", enable=CSV)),
           runbook="ecc.md",
           note="stock: uncorrectable remapped rows rising (plus Xid 48/63/64 through the xid family)"),
    Family("throttling", ("GPUThrottling",), False,
           stock=(Signal("DCGM_FI_DEV_SM_CLOCK"), Signal("DCGM_FI_DEV_GPU_UTIL"), Signal("DCGM_FI_DEV_GPU_TEMP"),
                  Signal("DCGM_FI_DEV_POWER_USAGE")),
           enhanced=(Signal("DCGM_FI_DEV_THERMAL_VIOLATION", enable=CSV), Signal("DCGM_FI_DEV_POWER_VIOLATION", enable=CSV)),
           alternatives=(Signal("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", enable=CSV),
                         Signal("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", enable=CSV)),
           identity_join=True, runbook="throttling.md",
           note="stock: SM clock far below its recent maximum while busy, with temperature at the slowdown "
                "point or power collapsed; enhanced: violation counters and clock-event bits"),
    Family("interconnect", ("GpuNvlinkErrors", "GpuPcieReplays", "GpuNvSwitchSXidFatal"), False,
           stock=(Signal("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),),
           enhanced=(Signal("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", enable=CSV),),
           runbook="interconnect.md",
           note="NVLink error counters are commented out in every shipped CSV: NVLink degradation is invisible "
                "on stock (PCIe replays are covered); NVSwitch SXid errors reach only the kernel log "
                "(gpuobs logwatch's gpuobs_sxid_events_total)"),
    Family("collective-hang", ("TrainingCollectiveHang",), True,
           stock=(Signal("DCGM_FI_DEV_GPU_UTIL"), Signal("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
                  Signal("DCGM_FI_DEV_POWER_USAGE")),
           enhanced=(Signal("DCGM_FI_PROF_SM_ACTIVE", enable=CSV),
                     Signal("training_steps_total", "app", "export training step counters from the job")),
           runbook="collective-hang.md",
           note="stock: GPU_UTIL high while tensor activity and power collapse on a node that was busy"),
    Family("training", ("TrainingStraggler",), False,
           stock=(Signal("training_step_duration_seconds_count", "app", "export step-time histograms from the job"),),
           identity_join=True, runbook="straggler.md"),
    Family("memory", ("KVFragmentationRisk", "GpuFrameworkOom"), False,
           stock=(Signal("DCGM_FI_DEV_FB_USED"), Signal("DCGM_FI_DEV_FB_FREE")),
           enhanced=(Signal("pytorch_cuda_memory_reserved_bytes", "app", APP),
                     Signal("pytorch_cuda_memory_allocated_bytes", "app", APP)),
           runbook="fragmentation.md",
           note="stock: FB used heading for capacity (predict_linear); enhanced: the allocator's reserved-vs-"
                "allocated gap. FB_* are absent on H100 MIG instances"),
    Family("exporter", ("GpuExporterDown", "GpuTelemetryStale", "ServingEngineDown", "Watchdog",
                        "GpuTelemetryWithoutIdentity"), True,
           stock=(Signal("up"), Signal("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")),
           optional=(Signal("up", "vllm"),), runbook="exporter.md"),
    Family("driver-skew", ("GpuDriverSkew",), False,
           stock=(Signal("DCGM_FI_DEV_GPU_TEMP"),), needs_driver_label=True, identity_join=True,
           runbook="driver-skew.md",
           note="needs the DCGM_FI_DRIVER_VERSION label, which the dcgm-exporter Helm chart's ConfigMap drops "
                "(chart 4.0.0-4.4.2, 4.5.3-4.8.2): restore the `DCGM_FI_DRIVER_VERSION, label` CSV line"),
    Family("kv-cache", ("ServingKVCachePressure",), False,
           stock=(Signal("vllm:kv_cache_usage_perc", "vllm"), Signal("vllm:num_preemptions_total", "vllm")),
           runbook="kv-cache.md"),
    Family("slo", ("ServingErrorBudgetBurn",), True,
           stock=(Signal("vllm:request_success_total", "vllm"), Signal("vllm:time_to_first_token_seconds_bucket", "vllm")),
           fleet_wide=True, runbook="slo.md"),
)
