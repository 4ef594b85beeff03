"""DCGM-compatible collector: turns a simulated :class:`Node` into metric families.

Names, types and HELP texts follow NVIDIA/dcgm-exporter etc/default-counters.csv; label names and
order follow dcgm-exporter (design §4.1): gpu, UUID, pci_bus_id, device, modelName, Hostname,
DCGM_FI_DRIVER_VERSION. A GPU that fell off the bus (Xid 79) is absent from the page, like the real
exporter; ``gpuobs_node_expected_gpus`` keeps "GPU missing" alertable (design §4.5).
"""

from __future__ import annotations

from gpuobs.exporter.exposition import Family, label_string
from gpuobs.exporter.gpu import GpuState
from gpuobs.exporter.node import Node

# (name, type, integer-formatted, help) -- HELP texts as in dcgm-exporter's default-counters.csv.
DCGM_FIELDS: list[tuple[str, str, bool, str]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", True, "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", True, "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", True, "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", True, "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", False, "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", True, "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", True, "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", True, "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", True, "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", True, "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", False, "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", False, "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", True, "Current clock event reasons (bitmask)."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", True, "Throttling duration due to thermal constraints (in ns)."),
]

XID_HELP = "Value of the last XID error encountered."
XID_COUNT_HELP = "Count of XID Errors within user-specified time window (see xid-count-window-size param)."


def _gpu_values(g: GpuState) -> list[float]:
    """Values of DCGM_FIELDS for one GPU, in table order."""
    return [
        round(g.sm_clock_mhz), g.model.mem_clock_mhz, round(g.temp_c + 4.0), round(g.temp_c),
        g.power_w, g.energy_mj, round(g.gpu_util_pct), g.fb_free_mib, g.fb_used_mib,
        g.model.fb_reserved_mib, g.sm_active, g.tensor_active, g.clock_event_reasons,
        g.thermal_violation_ns,
    ]


class DcgmCollector:
    """Builds the DCGM page of one node. ``hostname_label`` is ``Hostname`` (default) or ``hostname``."""

    def __init__(self, node: Node, hostname_label: str = "Hostname"):
        if hostname_label not in ("Hostname", "hostname"):
            raise ValueError(f"hostname_label must be 'Hostname' or 'hostname', got {hostname_label!r}")
        self.node = node
        self.hostname_label = hostname_label

    def identity_labels(self, g: GpuState) -> list[tuple[str, str]]:
        """dcgm-exporter's identity labels of one GPU, in order."""
        i = g.ident
        return [("gpu", str(i.index)), ("UUID", i.uuid), ("pci_bus_id", i.pci_bus_id), ("device", i.device),
                ("modelName", i.model_name), (self.hostname_label, self.node.hostname),
                ("DCGM_FI_DRIVER_VERSION", self.node.driver_version)]

    def collect(self) -> list[Family]:
        """Families for the node's present GPUs plus node-level self metrics. Thread-safe."""
        node = self.node
        fams = [Family(n, t, h, integer) for n, t, integer, h in DCGM_FIELDS]
        xid = Family("DCGM_FI_DEV_XID_ERRORS", "gauge", XID_HELP, True)
        xid_count = Family("DCGM_EXP_XID_ERRORS_COUNT", "gauge", XID_COUNT_HELP, True)
        window = str(node.cfg.xid_window_ms)
        with node.lock:
            for g in node.gpus:
                if not g.present:
                    continue
                ident = self.identity_labels(g)
                base = label_string(ident)
                for fam, value in zip(fams, _gpu_values(g)):
                    fam.samples.append((base, value))
                last = g.last_xid
                code, msg = (last.code, last.message) if last else (0, "No Error")
                xid.samples.append((label_string(ident + [("err_code", str(code)), ("err_msg", msg)]), code))
                for code, count in sorted(g.xid_counts().items()):
                    xid_count.samples.append(
                        (label_string(ident + [("window_size_in_ms", window), ("xid", str(code))]), count))
            expected = Family("gpuobs_node_expected_gpus", "gauge",
                              "Number of GPUs the node should have (GPUs that fell off the bus vanish from the DCGM page).",
                              True, [(label_string([(self.hostname_label, node.hostname)]), len(node.gpus))])
        return fams + [xid, xid_count, expected]
