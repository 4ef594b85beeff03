"""Stable identities for simulated nodes and GPUs.

A GPU's UUID and PCI bus id are a pure function of (seed, node index, GPU index), so the same
``--seed`` always yields the same fleet. Formats follow what dcgm-exporter prints:
UUID ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (NVML ``nvmlDeviceGetUUID``), PCI bus id
``00000000:31:00.0`` (domain:bus:device.function, NVML ``busIdLegacy`` widened to 8-digit domain),
device ``nvidia<minor>``.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

#: PCI bus numbers of the eight SXM GPUs on an HGX H100 baseboard as commonly enumerated
#: (e.g. DGX H100: 18, 2a, 3a, 5d, 9a, ab, ba, db). Beyond eight, buses continue upward.
HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


@dataclass(frozen=True)
class GpuIdentity:
    """Identity labels of one GPU: index, UUID, PCI bus id, device node, model name."""

    index: int
    uuid: str
    pci_bus_id: str
    device: str
    model_name: str

    @property
    def short_pci(self) -> str:
        """Bus id as the kernel log prints it in Xid lines, e.g. ``0000:18:00``."""
        domain, bus, rest = self.pci_bus_id.split(":")
        return f"{domain[-4:]}:{bus}:{rest.split('.')[0]}"


def gpu_identity(seed: int, node: int, index: int, model_name: str) -> GpuIdentity:
    """Deterministic identity for GPU ``index`` of node ``node`` under ``seed``."""
    digest = hashlib.sha256(f"gpuobs:{seed}:{node}:{index}".encode()).digest()
    u = uuid.UUID(bytes=digest[:16])
    bus = HGX_BUSES[index] if index < len(HGX_BUSES) else 0xDC + index - len(HGX_BUSES)
    return GpuIdentity(
        index=index,
        uuid=f"GPU-{u}",
        pci_bus_id=f"00000000:{bus:02X}:00.0",
        device=f"nvidia{index}",
        model_name=model_name,
    )


def hostname(prefix: str, node: int) -> str:
    """Hostname of simulated node ``node``: ``<prefix>-<node:02d>``, e.g. ``gpu-node-03``."""
    return f"{prefix}-{node:02d}"


#: Characters Kubernetes uses for generated name suffixes (apimachinery util/rand ``alphanums``:
#: no vowels, no 0/1/3, so suffixes never spell words or look alike).
K8S_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
#: Name of the GPU Operator's dcgm-exporter DaemonSet (and Service); its pods are ``<name>-<5 chars>``.
DCGM_EXPORTER_DAEMONSET = "nvidia-dcgm-exporter"


def pod_suffix(*parts: object) -> str:
    """A deterministic 5-character Kubernetes-style suffix for ``parts`` (e.g. ``x7k2p``)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return "".join(K8S_SUFFIX_ALPHABET[b % len(K8S_SUFFIX_ALPHABET)] for b in digest[:5])


def exporter_pod_name(seed: int, node: int, generation: int = 0) -> str:
    """Name of the dcgm-exporter pod on node ``node``: ``nvidia-dcgm-exporter-<5 chars>``; a new
    ``generation`` (the pod was replaced: rollout, eviction, restart of the DaemonSet) gives a new name."""
    return f"{DCGM_EXPORTER_DAEMONSET}-{pod_suffix('dcgm-exporter', seed, node, generation)}"
