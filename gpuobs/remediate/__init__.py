"""Interlocked remediation of GPU faults: quarantine, drain, act (GPU reset, node reboot, engine
restart), verify, return or escalate, driven by the pages Alertmanager routes to it."""
