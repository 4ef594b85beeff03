"""``gpuobs logwatch``: the node agent that turns the NVIDIA driver's kernel-log lines (Xid, SXid,
"GPU has fallen off the bus", the Xid 154 recovery action, "GPU at PCI" UUID lines) into exact
Prometheus counters, following ``/dev/kmsg``, ``journalctl -k``, a file, or a simulated node.

Modules: :mod:`.parser` (line -> event), :mod:`.sources` (followers with a persisted position),
:mod:`.state` (counters + position, saved atomically together), :mod:`.identity` (bus id -> GPU
index/UUID), :mod:`.agent` (the loop, the prometheus_client collector and the HTTP server). The
``gpuobs logwatch`` command group is :mod:`gpuobs.cli.logwatch`.
"""
