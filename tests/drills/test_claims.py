"""Claims: which concurrently running drill owns an alert (gpuobs/drills/runner.py)."""

from gpuobs.drills.runner import Claims


def test_running_drill_owns_its_alert_on_its_node_only():
    c = Claims()
    c.add("xid", {("GpuKernelXidCritical", "gpu-node-00"), ("GpuXidCritical", "gpu-node-00")})
    assert c.allows("GpuXidCritical", "gpu-node-00", exclude="collective-hang")
    assert not c.allows("GpuXidCritical", "gpu-node-03", exclude="collective-hang")
    assert not c.allows("GpuXidCritical", "gpu-node-00", exclude="xid")  # a drill never excuses itself


def test_ended_drill_keeps_alerts_that_became_active_while_it_ran():
    # The DCGM path's GpuXidCritical (5 min count window) outlives the xid drill: still the xid drill's.
    c = Claims()
    c.add("xid", {("GpuXidCritical", "gpu-node-00")})
    c.remove("xid", at=1000.0)
    assert c.allows("GpuXidCritical", "gpu-node-00", "collective-hang", active_at=902.0)
    assert c.allows("GpuXidCritical", "gpu-node-00", "collective-hang", active_at=1000.0)
    # One that starts after the drill ended is someone's false alert; without activeAt, no lingering.
    assert not c.allows("GpuXidCritical", "gpu-node-00", "collective-hang", active_at=1000.5)
    assert not c.allows("GpuXidCritical", "gpu-node-00", "collective-hang")
    # Running the drill again replaces the ended record.
    c.add("xid", {("GpuXidCritical", "gpu-node-00")})
    c.remove("xid", at=2000.0)
    assert c.allows("GpuXidCritical", "gpu-node-00", "other", active_at=1500.0)
