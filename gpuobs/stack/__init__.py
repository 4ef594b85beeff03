"""The stack's processes: the native supervisor (``gpuobs stack up|down|status|restart``), its typed
``stack.json`` state, config rendering into the run directory, loopback ports, alert-delivery timing,
Grafana, the Prometheus UI probe, the HA topology (``ha.py``) and compose mode (``compose.py``).

The pager lives in :mod:`gpuobs.pager`, the drills in :mod:`gpuobs.drills`.
"""
