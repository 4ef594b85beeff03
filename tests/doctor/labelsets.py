"""Realistic label sets of GPU fleets as a Prometheus stores them, for gpuobs doctor's tests.

Field lists (what each counters file enables), read from NVIDIA/dcgm-exporter at tag 4.5.3-4.8.2:
``STOCK_FIELDS`` are the uncommented metric lines of etc/default-counters.csv (25 metrics, plus the
DCGM_FI_DRIVER_VERSION label line); the Helm chart's ConfigMap (deployment/templates/metrics-configmap.yaml)
drops DCGM_FI_DEV_FB_RESERVED and the driver label. ``RECOMMENDED_EXTRA`` is what deploy/dcgm-exporter/
recommended.csv adds (docs/real-fleet.md, step 2). Label shapes: docs/metrics.md (dcgm-exporter's label order,
host-label variants, MIG instances without GPU_UTIL/MEM_COPY_UTIL and, on H100, FB_*) and kube-prometheus
ServiceMonitor targets (job = Service name, pod labels stored as exported_*, no node).
"""

from __future__ import annotations

from tests.fakes.prometheus import SeriesSet

STOCK_FIELDS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES")
HELM_DROPS = ("DCGM_FI_DEV_FB_RESERVED",)
RECOMMENDED_EXTRA = (
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_EXP_XID_ERRORS_COUNT")
#: Series a MIG instance does not get (docs/metrics.md#mig-instances; dcgm-exporter #105, #512, #380 for H100).
MIG_ABSENT = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
              "DCGM_FI_DEV_FB_RESERVED")
ALLOCATOR = ("pytorch_cuda_memory_allocated_bytes", "pytorch_cuda_memory_reserved_bytes",
             "pytorch_cuda_memory_inactive_split_bytes", "pytorch_cuda_alloc_retries_total", "pytorch_cuda_ooms_total")
VLLM = ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:num_requests_running")
DRIVER = "550.54.15"
POD_SUFFIXES = ("x7k2q", "b9mzt", "4hwcp", "r2d6n", "tq8vz", "kk5fs")


def fields(profile: str) -> tuple[str, ...]:
    """The DCGM metric names a healthy exporter of ``profile`` serves (the Xid gauge is absent until an Xid)."""
    base = tuple(f for f in STOCK_FIELDS if f != "DCGM_FI_DEV_XID_ERRORS")
    if profile == "stock":
        return base
    if profile == "helm":
        return tuple(f for f in base if f not in HELM_DROPS)
    if profile == "recommended":
        return base + RECOMMENDED_EXTRA
    raise ValueError(profile)


def fleet(profile: str = "stock", nodes: int = 4, gpus: int = 2, host: str = "Hostname", scrape: str = "file_sd",
          node_label: bool = True, driver: bool | None = None, mig: dict[int, int] | None = None,
          engines: bool = True, training: bool = True, xid: dict[int, int] | None = None,
          per_node_fields: dict[int, tuple[str, ...]] | None = None, same_node: tuple[int, int] | None = None,
          vllm_names: tuple[str, ...] = VLLM, down: tuple[int, ...] = (), logwatch: bool = False,
          xid_legacy: bool = False) -> SeriesSet:
    """A fleet's TSDB at one instant.

    ``profile``: stock / helm / recommended (recommended adds gpuobs's extras: allocator metrics and
    ``gpuobs_node_expected_gpus``); ``host``: Hostname / hostname / localhost / pod / none; ``scrape``:
    ``file_sd`` (jobs dcgm, vllm) or ``servicemonitor`` (kube-prometheus: jobs nvidia-dcgm-exporter and
    vllm-engine, pod labels as exported_*); ``node_label``: the scrape adds ``node``; ``driver``: the
    DCGM_FI_DRIVER_VERSION label (default: not on helm); ``mig``: {gpu index: instances} on every node;
    ``xid``: {node index: code} of the last Xid; ``per_node_fields``: override the field list of some
    nodes; ``same_node``: (i, j) gives node j the node label of node i; ``down``: node indexes whose
    DCGM target is down (up 0, no series); ``logwatch``: every node runs logwatch, which has read its
    source and counted no Xid yet (``gpuobs_logwatch_source_up`` 1, no ``gpuobs_xid_events_total``);
    ``xid_legacy``: the Xid gauge as dcgm-exporter before 3.3.6 serves it (no err_code; value = code)."""
    ts = SeriesSet()
    driver = profile != "helm" if driver is None else driver
    for i in range(nodes):
        name = f"gpu-node-{i:02d}"
        pod = f"nvidia-dcgm-exporter-{POD_SUFFIXES[i % len(POD_SUFFIXES)]}"
        if scrape == "file_sd":
            target = {"job": "dcgm", "instance": f"10.0.0.{11 + i}:9400"}
            vtarget = {"job": "vllm", "instance": f"10.0.0.{11 + i}:8000"}
        else:
            target = {"job": "nvidia-dcgm-exporter", "instance": f"10.244.{i}.5:9400", "namespace": "gpu-operator",
                      "pod": pod, "service": "nvidia-dcgm-exporter", "endpoint": "gpu-metrics",
                      "container": "nvidia-dcgm-exporter"}
            vtarget = {"job": "vllm-engine", "instance": f"10.244.{i}.9:8000", "namespace": "serving",
                       "pod": f"vllm-engine-{POD_SUFFIXES[i % len(POD_SUFFIXES)]}", "service": "vllm-engine",
                       "endpoint": "http"}
        if node_label:
            label_of = f"gpu-node-{same_node[0]:02d}" if same_node and i == same_node[1] else name
            target["node"] = label_of
            vtarget["node"] = label_of
        ts.add("up", target, 0.0 if i in down else 1.0)
        is_training = training and i == nodes - 1
        if engines and not is_training:
            ts.add("up", vtarget)
            for m in vllm_names:
                ts.add(m, {**vtarget, "model_name": "llama-3-8b", "engine": "0"})
        if i in down:
            continue
        host_labels = {"Hostname": name, "hostname": None, "localhost": "localhost", "pod": pod, "none": None}
        page_host = {}
        if host == "hostname":
            page_host = {"hostname": name}
        elif host_labels.get(host):
            page_host = {"Hostname": host_labels[host]}
        names = (per_node_fields or {}).get(i, fields(profile))
        for g in range(gpus):
            base = {"gpu": str(g), "UUID": f"GPU-{i:02d}{g:02d}0000-0000-0000-0000-000000000000",
                    "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0", "device": f"nvidia{g}",
                    "modelName": "NVIDIA H100 80GB HBM3"}
            instances = [{}] if not mig or g not in mig else [
                {"GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": str(7 + k)} for k in range(mig[g])]
            for inst in instances:
                labels = {**base, **inst, **page_host}
                if driver:
                    labels["DCGM_FI_DRIVER_VERSION"] = DRIVER
                if g == 0 and engines and not is_training:  # a workload owns GPU 0
                    wl = {"pod": "llama-serving-0", "namespace": "serving", "container": "vllm"}
                    if scrape == "servicemonitor":
                        wl = {f"exported_{k}": v for k, v in wl.items()}
                    labels.update(wl)
                for m in names:
                    if inst and m in MIG_ABSENT:
                        continue
                    ts.add(m, {**labels, **target})
                if xid and i in xid and not inst:
                    code = {} if xid_legacy else {"err_code": str(xid[i]), "err_msg": "Double Bit ECC Error"}
                    ts.add("DCGM_FI_DEV_XID_ERRORS", {**labels, **target, **code}, float(xid[i]))
                if profile == "recommended":
                    for m in ALLOCATOR:
                        ts.add(m, {"gpu": str(g), **target})
        if profile == "recommended":
            ts.add("gpuobs_node_expected_gpus", target, float(gpus))
        if logwatch:
            lw = {"job": "logwatch", "instance": f"10.0.0.{11 + i}:9500", **({"node": name} if node_label else {})}
            ts.add("up", lw)
            ts.add("gpuobs_logwatch_source_up", lw, 1.0)
        if is_training:
            for m in ("training_steps_total", "training_step_duration_seconds_count"):
                ts.add(m, {**target, "rank": "0"})
    return ts
