"""``gpuobs logwatch``: the node agent that turns the NVIDIA driver's kernel-log lines (Xid, SXid,
"GPU has fallen off the bus", the Xid 154 recovery action, "GPU at PCI" UUID lines) into exact
Prometheus counters, following ``/dev/kmsg``, ``journalctl -k``, a file, or a simulated node.

Modules: :mod:`.parser` (line -> event), :mod:`.sources` (followers with a persisted position),
:mod:`.state` (counters + position, saved atomically together), :mod:`.identity` (bus id -> GPU
index/UUID), :mod:`.metrics` (prometheus_client collector), :mod:`.agent` (the loop + HTTP server),
:mod:`.cli` (the command group).
"""
