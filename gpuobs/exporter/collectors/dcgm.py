"""DCGM-compatible collector: turns a simulated :class:`Node` into the metric families of its
``/metrics`` page (job ``dcgm``) as a dcgm-exporter with a given exporter profile
(:mod:`gpuobs.exporter.sim.profiles`) would serve it: the profile's counters file decides which DCGM
fields appear, with the file's names, types and HELP texts, like dcgm-exporter 4.x
(internal/pkg/counters/counter_config.go, tag 4.5.3-4.8.2); training ranks' application metrics are
added on training nodes; profiles with gpuobs extras add the framework allocator, expected GPUs and
collector-success gauges.

Label names and order follow dcgm-exporter's internal/pkg/rendermetrics/render_metrics.go (4.5.3-4.8.2):
gpu, UUID, pci_bus_id, device, modelName, [GPU_I_PROFILE, GPU_I_ID,] [host label, per the host-label
mode,] [DCGM_FI_DRIVER_VERSION when the counters file has that label line,] then sorted attributes
([container, err_code, err_msg, namespace, pod]). A GPU that fell off the bus (Xid 79) is absent, like
the real exporter. Each section runs guarded: one that raises is reported by
``gpuobs_exporter_collector_success`` (like node_exporter's ``node_scrape_collector_success``, on
profiles with gpuobs extras) and does not break the page.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuobs.core import log
from gpuobs.exporter.collectors.training import training_families
from gpuobs.exporter.exposition import Family, Prerendered, Template, label_string, render
from gpuobs.exporter.sim import profiles
from gpuobs.exporter.sim.gpu import GpuState
from gpuobs.exporter.sim.mig import MigProfile
from gpuobs.exporter.sim.node import Node
from gpuobs.reference import dcgm_exporter

_log = log.get("collector")

G = GpuState
# (name, type, integer-formatted, help, value getter). HELP texts as in dcgm-exporter's CSV.
DCGM_FIELDS: list[tuple[str, str, bool, str, Callable[[G], float]]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", True, "SM clock frequency (in MHz).", lambda g: round(g.sm_clock_mhz)),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", True, "Memory clock frequency (in MHz).", lambda g: g.model.mem_clock_mhz),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", True, "Memory temperature (in C).", lambda g: round(g.temp_c + 4.0)),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", True, "GPU temperature (in C).", lambda g: round(g.temp_c)),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", False, "Power draw (in W).", lambda g: g.power_w),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", True, "Total energy consumption since boot (in mJ).",
     lambda g: g.energy_mj),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", True, "Total number of PCIe retries.", lambda g: g.pcie_replays),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", True, "GPU utilization (in %).", lambda g: round(g.gpu_util_pct)),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", True, "Memory utilization (in %).", lambda g: round(100 * g.dram_active)),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", True, "Encoder utilization (in %).", lambda g: 0),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", True, "Decoder utilization (in %).", lambda g: 0),
    ("DCGM_FI_DEV_FB_FREE", "gauge", True, "Framebuffer memory free (in MiB).", lambda g: g.fb_free_mib),
    ("DCGM_FI_DEV_FB_USED", "gauge", True, "Framebuffer memory used (in MiB).", lambda g: g.fb_used_mib),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", True, "Framebuffer memory reserved (in MiB).",
     lambda g: g.model.fb_reserved_mib),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", True,
     "Total number of NVLink bandwidth counters for all lanes.", lambda g: g.nvlink_bandwidth_total),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", True, "vGPU License status", lambda g: 0),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", True, "Number of remapped rows for uncorrectable errors",
     lambda g: g.remapped_rows_uncorrectable),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", True, "Number of remapped rows for correctable errors",
     lambda g: g.remapped_rows_correctable),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", True, "Whether remapping of rows has failed",
     lambda g: g.row_remap_failure),
    # DCGM field DCGM_FI_DEV_ROW_REMAP_PENDING (NVML nvmlDeviceGetRemappedRows isPending): a remap
    # recorded for an error is applied at the next GPU reset; 1 until then.
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", True, "Whether remapping of rows is pending (a GPU reset applies it)",
     lambda g: g.row_remap_pending),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", False, "Ratio of time the graphics engine is active.",
     lambda g: g.sm_active * 1.05 if not g.hung else 0.98),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", False, "Ratio of cycles the tensor (HMMA) pipe is active.",
     lambda g: g.tensor_active),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", False,
     "Ratio of cycles the device memory interface is active sending or receiving data.", lambda g: g.dram_active),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", True,
     "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
     lambda g: g.activity * g.model.pcie_bytes_per_s_at_full_load * 0.3),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", True,
     "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
     lambda g: g.activity * g.model.pcie_bytes_per_s_at_full_load * 0.5),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", False, "The ratio of cycles an SM has at least 1 warp assigned.",
     lambda g: g.sm_active),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", False, "The ratio of number of warps resident on an SM.",
     lambda g: g.sm_active * 0.45),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", True, "Current clock event reasons (bitmask).",
     lambda g: g.clock_event_reasons),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", True, "Throttling duration due to power constraints (in ns).",
     lambda g: g.power_violation_ns),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", True, "Throttling duration due to thermal constraints (in ns).",
     lambda g: g.thermal_violation_ns),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", True, "Total number of single-bit volatile ECC errors.",
     lambda g: g.ecc_sbe_vol),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", True, "Total number of double-bit volatile ECC errors.",
     lambda g: g.ecc_dbe_vol),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", True, "Total number of single-bit persistent ECC errors.",
     lambda g: g.ecc_sbe_agg),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", True, "Total number of double-bit persistent ECC errors.",
     lambda g: g.ecc_dbe_agg),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", True,
     "Total number of NVLink flow-control CRC errors.", lambda g: g.nvlink_crc_flit_errors),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", True, "Total number of NVLink retries.",
     lambda g: g.nvlink_replay_errors),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", True, "Total number of NVLink recovery errors.",
     lambda g: g.nvlink_recovery_errors),
]
#: Fields a MIG instance does not report (docs/metrics.md: use the PROF ratios instead; dcgm-exporter #105).
MIG_EXCLUDED = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"}
#: Framebuffer fields, absent on MIG instances of products whose ``mig_instance_fb`` is False (H100).
FB_FIELDS = {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"}
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
XID_COUNT_FIELD = "DCGM_EXP_XID_ERRORS_COUNT"
#: What the simulator can serve per DCGM field name: (integer-formatted, value getter). Field 112 is
#: served under either name, whichever the counters file uses (like dcgm-exporter, which prints the
#: name as written in the file).
CATALOGUE: dict[str, tuple[bool, Callable[[G], float]]] = {name: (integer, get) for name, _t, integer, _h, get in DCGM_FIELDS}
CATALOGUE[profiles.CLOCK_EVENTS_LEGACY] = CATALOGUE[profiles.CLOCK_EVENTS_FIELD]
#: Label fields the simulator can fill (value: the node's driver version).
LABEL_FIELDS = ("DCGM_FI_DRIVER_VERSION",)

XID_HELP = "Value of the last XID error encountered."
XID_COUNT_HELP = "Count of XID Errors within user-specified time window (see xid-count-window-size param)."

# torch.cuda.memory_stats keys as Prometheus metrics (docs/metrics.md; pytorch torch/cuda/memory.py).
ALLOCATOR_FIELDS = [
    ("pytorch_cuda_memory_allocated_bytes", "gauge", "Bytes held by live tensors (allocated_bytes.all.current).",
     lambda g: g.alloc.allocated),
    ("pytorch_cuda_memory_reserved_bytes", "gauge",
     "Bytes reserved by the caching allocator (reserved_bytes.all.current).", lambda g: g.alloc.reserved),
    ("pytorch_cuda_memory_inactive_split_bytes", "gauge",
     "Bytes in inactive, non-releasable split blocks (inactive_split_bytes.all.current).",
     lambda g: g.alloc.inactive_split),
    ("pytorch_cuda_alloc_retries_total", "counter",
     "cudaMalloc calls that failed and were retried after freeing the cache (num_alloc_retries).",
     lambda g: g.alloc.retries),
    ("pytorch_cuda_ooms_total", "counter", "Out-of-memory errors raised by the allocator (num_ooms).",
     lambda g: g.alloc.ooms),
]

_ALLOCATOR_GETTERS = [get for *_, get in ALLOCATOR_FIELDS]

K8sMap = dict[str, dict[int, dict[str, str]]]


class DcgmCollector:
    """Builds the DCGM page of one node, as the exporter ``profile`` serves it.

    ``profile``: an :class:`~gpuobs.exporter.sim.profiles.ExporterProfile` or a profile name
    (``stock`` default, ``helm``, ``recommended``). ``host_label_mode``: one of
    :data:`~gpuobs.exporter.sim.profiles.HOST_LABEL_MODES`. ``mig``: GPU index -> MIG profile.
    ``k8s``: hostname -> GPU index -> {pod, namespace, container}. ``collect_interval_s``: DCGM's
    field update interval (dcgm-exporter ``-c``, default 30000 ms): values are sampled at most that
    often in simulated time and repeat on the scrapes in between; 0 samples on every scrape.
    Raises ValueError for an unknown profile, mode, or a counters file naming a field the simulator
    cannot serve.
    """

    def __init__(self, node: Node, host_label_mode: str = "Hostname", mig: dict[int, MigProfile] | None = None,
                 k8s: K8sMap | None = None, cache: bool = True,
                 profile: profiles.ExporterProfile | str = "stock", collect_interval_s: float = 0.0):
        profiles.host_label(host_label_mode, "", "")  # validates the mode
        self.profile = profiles.load(profile) if isinstance(profile, str) else profile
        unknown = [c.name for c in self.profile.metric_fields
                   if c.name not in CATALOGUE and c.name not in (XID_FIELD, XID_COUNT_FIELD)]
        unknown += [n for n in self.profile.label_fields if n not in LABEL_FIELDS]
        if unknown:
            raise ValueError(f"exporter profile {self.profile.name!r}: the simulator cannot serve {', '.join(unknown)}; "
                             f"it serves {', '.join(sorted([*CATALOGUE, XID_FIELD, XID_COUNT_FIELD, *LABEL_FIELDS]))}")
        if collect_interval_s < 0:
            raise ValueError(f"collect_interval_s must be >= 0, got {collect_interval_s!r}")
        self.node = node
        self.host_label_mode = host_label_mode
        self.mig = mig or {}
        self.pods = (k8s or {}).get(node.hostname, {})
        self.collect_interval_s = collect_interval_s
        #: Whether the page carries gpuobs_exporter_* self-metrics (the server adds its own two).
        self.self_metrics = self.profile.gpuobs_extras
        #: (name, type, integer, help, getter) of each DCGM series family on the page, counters-file order.
        self._fields = [(c.name, c.type, CATALOGUE[c.name][0], c.help, CATALOGUE[c.name][1])
                        for c in self.profile.metric_fields if c.name in CATALOGUE]
        meta = {c.name: c for c in self.profile.metric_fields}
        self._xid_meta = meta.get(XID_FIELD)
        self._xid_count_meta = meta.get(XID_COUNT_FIELD)
        self._driver_label = "DCGM_FI_DRIVER_VERSION" in self.profile.label_fields
        #: ``cache=False`` renders every scrape from scratch (the reference the cached output must equal).
        self.cache = cache
        self._key: tuple | None = None  # label values the cached strings were built for
        self._gpu_ls: list[str] = []  # rendered identity labels of each present GPU
        self._series_ls: list[str] = []  # ... of each DCGM series (a GPU, or a MIG instance)
        self._dcgm_tmpl: Template | None = None
        self._alloc_tmpl: Template | None = None
        self._sample: tuple | None = None  # (sim time, layout key, DCGM values, Xid state): collect interval
        self._getters = [f[4] for f in self._fields]
        self._host: tuple = (None, [])  # ((mode, hostname, exporter generation), host pairs)
        self._xid_text: tuple = (None, None)  # (layout key + Xid state, rendered Xid section)
        self._ls: dict[tuple, str] = {}  # host-level label strings (collector success, expected GPUs)

    @property
    def host_pairs(self) -> list[tuple[str, str]]:
        """The page's host label as ``[(name, value)]``, or ``[]`` in mode ``none``."""
        node = self.node
        # the pod name (mode ``pod``) is a function of the exporter generation: hash it only when that changes
        key = (self.host_label_mode, node.hostname, node.exporter_generation)
        if key != self._host[0]:
            pair = profiles.host_label(self.host_label_mode, node.hostname, node.exporter_pod)
            self._host = (key, [pair] if pair else [])
        return list(self._host[1])

    def _label_string(self, pairs: list[tuple[str, str]]) -> str:
        """:func:`label_string` of host-level pairs, remembered (a handful per node)."""
        key = tuple(pairs)
        ls = self._ls.get(key)
        if ls is None:
            if len(self._ls) > 64:
                self._ls.clear()
            ls = self._ls[key] = label_string(pairs)
        return ls

    def identity_labels(self, g: GpuState, mig: tuple[str, int] | None = None,
                        attributes: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
        """dcgm-exporter's labels of one GPU (or MIG instance), in its order (render_metrics.go): gpu,
        UUID, pci_bus_id, device, modelName, [GPU_I_PROFILE, GPU_I_ID], [host label], label fields
        (DCGM_FI_DRIVER_VERSION), then the attributes sorted by name: the pod's container, namespace,
        pod (kubernetes.go) and ``attributes`` (e.g. the Xid gauge's err_code, err_msg)."""
        i = g.ident
        labels = [("gpu", str(i.index)), ("UUID", i.uuid), ("pci_bus_id", i.pci_bus_id), ("device", i.device),
                  ("modelName", i.model_name)]
        if mig:
            labels += [("GPU_I_PROFILE", mig[0]), ("GPU_I_ID", str(mig[1]))]
        labels += self.host_pairs
        if self._driver_label:
            labels.append(("DCGM_FI_DRIVER_VERSION", self.node.driver_version))
        pod = self.pods.get(i.index) or {}
        attrs = [(k, pod[k]) for k in ("container", "namespace", "pod") if pod.get(k)] + list(attributes or [])
        return labels + sorted(attrs)

    def _series(self, present: list[GpuState]) -> list[tuple[GpuState, tuple[MigProfile, int, int] | None]]:
        """DCGM series in page order: ``(gpu, None)``, or ``(gpu, (profile, k, instance id))`` per MIG instance."""
        out: list[tuple[GpuState, tuple[MigProfile, int, int] | None]] = []
        for g in present:
            prof = self.mig.get(g.ident.index)
            if prof is None:
                out.append((g, None))
            else:
                out.extend((g, (prof, k, gi)) for k, gi in enumerate(prof.instance_ids))
        return out

    @staticmethod
    def _reports(name: str, g: GpuState, m: tuple | None) -> bool:
        """Whether a series (a GPU, or a MIG instance ``m``) reports field ``name``."""
        if m is None:
            return True
        return name not in MIG_EXCLUDED and (g.model.mig_instance_fb or name not in FB_FIELDS)

    @staticmethod
    def _mig_value(name: str, get: Callable[[G], float], g: GpuState, prof: MigProfile, k: int) -> float:
        n = len(prof.instance_ids)
        share = (0.85 + 0.3 * k / max(1, n - 1)) / n if n > 1 else 1.0
        if name == "DCGM_FI_DEV_FB_USED":
            return min(prof.memory_mib, g.fb_used_mib * share)
        if name == "DCGM_FI_DEV_FB_FREE":
            return max(0.0, prof.memory_mib - min(prof.memory_mib, g.fb_used_mib * share))
        if name.startswith("DCGM_FI_PROF_"):
            return min(1.0, get(g) * (0.9 + 0.2 * k / max(1, n - 1))) if "PCIE" not in name else get(g) / n
        return get(g)  # clocks, temperature, power, counters: the parent's values

    def _dcgm_values(self, series: list) -> list[float]:
        """Every DCGM sample's value in page order: per field (counters-file order), the series reporting it."""
        if not self.mig:
            gpus = [g for g, _ in series]
            return [get(g) for get in self._getters for g in gpus]
        return [get(g) if m is None else self._mig_value(name, get, g, m[0], m[1])
                for name, *_, get in self._fields for g, m in series if self._reports(name, g, m)]

    def _dcgm_fams(self, series: list, values: list[float]) -> list[Family]:
        fams, it = [], iter(values)
        for name, mtype, integer, help_text, _g in self._fields:
            labels = [ls for ls, (g, m) in zip(self._series_ls, series) if self._reports(name, g, m)]
            fams.append(Family(name, mtype, help_text, integer, [(ls, next(it)) for ls in labels]))
        return fams

    def _refresh_labels(self, present: list[GpuState]) -> None:
        """Render the identity label strings, unless cached ones were built for the same label values
        (GPUs present, host label, driver version, MIG layout, pod labels). Drops stale templates."""
        key = (tuple(self.host_pairs), self.node.driver_version, tuple(g.ident for g in present),
               tuple(sorted(self.mig.items())), tuple((i, tuple(p.items())) for i, p in sorted(self.pods.items())))
        if self.cache and key == self._key:
            return
        self._key, self._dcgm_tmpl, self._alloc_tmpl = key, None, None
        self._gpu_ls = [label_string(self.identity_labels(g)) for g in present]
        self._series_ls = [label_string(self.identity_labels(g, (m[0].name, m[2]) if m else None))
                           for g, m in self._series(present)]

    def _sampled(self, present: list[GpuState]) -> tuple[list[float], list[tuple]]:
        """The DCGM values and each present GPU's Xid state ``(last Xid, counts in window)``: sampled now,
        or the previous sample while the collect interval has not elapsed and the layout is unchanged."""
        now, key = self.node.now, (self._key, self.node.exporter_generation)  # a new exporter samples afresh
        if (self.collect_interval_s > 0 and self._sample is not None and self._sample[1] == key
                and now - self._sample[0] < self.collect_interval_s):
            return self._sample[2], self._sample[3]
        values = self._dcgm_values(self._series(present))
        xids = [(g.last_xid, sorted(g.xid_counts().items())) for g in present]
        self._sample = (now, key, values, xids)
        return values, xids

    def _xid_section(self, present: list[GpuState], xids: list[tuple]) -> list[Family | Prerendered]:
        """:meth:`_xid`, rendered once per label layout and Xid state (last code, counts in the window)."""
        if not self.cache:
            return self._xid(present, xids)
        key = (self._key, self.node.cfg.xid_window_ms,
               tuple((last.code if last is not None else None, tuple(counts)) for last, counts in xids))
        if key != self._xid_text[0]:
            self._xid_text = (key, render(self._xid(present, xids)))
        return [Prerendered(self._xid_text[1])]

    def _xid(self, present: list[GpuState], xids: list[tuple]) -> list[Family]:
        """dcgm-exporter 4.4+/4.5.x Xid series. DCGM_FI_DEV_XID_ERRORS: only GPUs that had an Xid since
        the exporter started, value and ``err_code`` the last code, ``err_msg`` dcgm-exporter's text
        (gpu_collector.go). DCGM_EXP_XID_ERRORS_COUNT: per GPU and ``xid`` in the window; a GPU without
        one gets a single 0 series with no ``xid`` label (expcollector.go)."""
        out = []
        if self._xid_meta is not None:
            fam = Family(XID_FIELD, self._xid_meta.type, self._xid_meta.help, True)
            for g, (last, _c) in zip(present, xids):
                if last is not None:
                    err = [("err_code", str(last.code)), ("err_msg", dcgm_exporter.xid_text(last.code))]
                    fam.samples.append((label_string(self.identity_labels(g, attributes=err)), last.code))
            out.append(fam)
        if self._xid_count_meta is not None:
            fam = Family(XID_COUNT_FIELD, self._xid_count_meta.type, self._xid_count_meta.help, True)
            window = ("window_size_in_ms", str(self.node.cfg.xid_window_ms))
            for g, (_l, counts) in zip(present, xids):
                base = self.identity_labels(g)
                ident, attrs = base[:len(base) - self._n_attrs(g)], base[len(base) - self._n_attrs(g):]
                for c, n in counts or [(None, 0)]:
                    extra = [window] + ([("xid", str(c))] if c is not None else [])
                    fam.samples.append((label_string(ident + extra + attrs), n))
            out.append(fam)
        return out

    def _n_attrs(self, g: GpuState) -> int:
        pod = self.pods.get(g.ident.index) or {}
        return sum(1 for k in ("container", "namespace", "pod") if pod.get(k))

    def _allocator(self, present: list[GpuState]) -> list[Family | Prerendered]:
        """The allocator gauges (labels refreshed by :meth:`collect`)."""
        values = [get(g) for get in _ALLOCATOR_GETTERS for g in present]
        if self._alloc_tmpl is None:
            fams = [Family(n, t, h, None, list(zip(self._gpu_ls, values[k * len(present):])))
                    for k, (n, t, h, _) in enumerate(ALLOCATOR_FIELDS)]
            if not self.cache:
                return fams
            self._alloc_tmpl = Template(fams)
        return [Prerendered(self._alloc_tmpl.fill(values))]

    def _training(self, present: list[GpuState]) -> list[Family]:
        tr = self.node.training
        if tr is None:
            return []
        return training_families(tr, [self.identity_labels(g) for g in self.node.gpus])

    def collect(self) -> list[Family]:
        """Families for the node's present GPUs, plus (profiles with gpuobs extras) node-level self
        metrics. Thread-safe."""
        node = self.node
        host = self.host_pairs
        out: list[Family] = []
        success = Family("gpuobs_exporter_collector_success", "gauge",
                         "Whether a collector succeeded in the last scrape (1) or raised (0).", True)
        with node.lock:
            present = [g for g in node.gpus if g.present]
            self._refresh_labels(present)
            values, xids = self._sampled(present)
            sections: list[tuple[str, Callable[[], list[Family]]]] = [
                ("dcgm", lambda: self._dcgm_families(present, values)),
                ("xid", lambda: self._xid_section(present, xids)),
            ]
            if self.profile.gpuobs_extras:
                sections.append(("allocator", lambda: self._allocator(present)))
            sections.append(("training", lambda: self._training(present)))
            for name, fn in sections:
                try:
                    out.extend(fn())
                    ok = 1
                except Exception:  # a broken collector must not break the page (node_exporter semantics)
                    _log.exception("collector failed", extra={"fields": {"collector": name, "hostname": node.hostname}})
                    ok = 0
                success.samples.append((self._label_string(host + [("collector", name)]), ok))
            if self.profile.gpuobs_extras:
                out.append(Family("gpuobs_node_expected_gpus", "gauge",
                                  "Number of GPUs the node should have (GPUs that fell off the bus vanish from the DCGM page).",
                                  True, [(self._label_string(host), len(node.gpus))]))
        if self.self_metrics:
            out.append(success)
        return out

    def _dcgm_families(self, present: list[GpuState], values: list[float]) -> list[Family | Prerendered]:
        """The DCGM fields: from the cached template when the label values are unchanged (one
        ``%``-format per scrape), else rendered from families (``cache=False``: always). Labels
        refreshed by :meth:`collect`."""
        if self._dcgm_tmpl is None:
            fams = self._dcgm_fams(self._series(present), values)
            if not self.cache:
                return fams
            self._dcgm_tmpl = Template(fams)
        return [Prerendered(self._dcgm_tmpl.fill(values))]
