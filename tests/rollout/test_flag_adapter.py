"""The flag fleet adapter over real node servers: version = flagd's answer, confirmed flips, kill."""

from __future__ import annotations

import json

import pytest

from gpuobs.promapi.exporter_admin import AdminClient
from gpuobs.rollout.adapters.flags import StackFlagFleet
from gpuobs.rollout.interfaces import FleetError
from gpuobs.stack.ports import free_port_range
from gpuobs.stack.state import StackState
from tests.rollout.test_rollout_resume import flag_run  # noqa: F401  (fixture)


def _fleet(run, **kw) -> StackFlagFleet:
    return StackFlagFleet(StackState.from_dict(json.loads((run / "stack.json").read_text())), "spec_decode", **kw)


def test_deploy_flips_one_node_and_waits_for_its_engine(flag_run):  # noqa: F811
    run, seen = flag_run
    fleet = _fleet(run, confirm_s=5.0, poll_s=0.02)
    assert [fleet.version(h) for h in fleet.hosts] == ["spec_decode=off"] * 3
    assert fleet.deploy("gpu-node-01", "spec_decode=on") == "spec_decode=off"
    assert seen["gpu-node-01"] == [False, True]  # confirmed by the engine itself before returning
    assert [fleet.version(h) for h in fleet.hosts] == ["spec_decode=off", "spec_decode=on", "spec_decode=off"]
    assert fleet.known("gpu-node-00")
    with pytest.raises(FleetError, match="flips spec_decode, not kv_policy_v2"):
        fleet.deploy("gpu-node-00", "kv_policy_v2=on")
    with pytest.raises(FleetError, match="unknown node"):
        fleet.version("gpu-node-09")


def test_an_engine_that_does_not_confirm_fails_the_flip_but_not_the_kill(flag_run):  # noqa: F811
    run, _ = flag_run
    fleet = _fleet(run, confirm_s=0.3, poll_s=0.05)
    fleet.base._admin["gpu-node-02"] = AdminClient(f"http://127.0.0.1:{free_port_range(1)}", "t", 0.2)
    with pytest.raises(FleetError, match="gpu-node-02: the engine did not report spec_decode=on within"):
        fleet.deploy("gpu-node-02", "spec_decode=on")
    was_on, unconfirmed = fleet.kill("test")
    assert was_on == ["gpu-node-02"] and len(unconfirmed) == 1 and unconfirmed[0].startswith("gpu-node-02: ")
    assert [fleet.version(h) for h in fleet.hosts] == ["spec_decode=off"] * 3
    with pytest.raises(FleetError, match="killed"):
        fleet.deploy("gpu-node-00", "spec_decode=on")
