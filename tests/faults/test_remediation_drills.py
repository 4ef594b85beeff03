"""Fault suite, part 3: the five remediation drills (gpuobs/drills/remediation.py) on a live stack of
their own whose controller enforces (drill rule profile, 8 nodes of which 7 serve, free loopback ports,
own run directory): Xid 48 remediated end to end, a person's uncordon winning, a SIGKILL of the
controller mid-drain, the fragmentation restart before the OOM, and a 5-node Xid 79 storm tripping the
breaker with one page. Each drill's times and checks go into the fault table. Runs only in
``make test-faults`` (GPUOBS_FAULT_SUITE=1): about 12 minutes."""

from __future__ import annotations

import io
import os

import pytest

from gpuobs.drills import remediation as rd
from gpuobs.stack import supervisor
from gpuobs.stack.ports import free_port_range
from gpuobs.stack.render import Ports
from tests.faults.conftest import record

pytestmark = [pytest.mark.live, pytest.mark.skipif(os.environ.get("GPUOBS_FAULT_SUITE") != "1",
                                                   reason="live remediation drills run in `make test-faults`")]


def test_remediation_drills_on_a_live_stack(tmp_path):
    b = free_port_range(40)
    ports = Ports(prometheus=b, alertmanager=b + 1, pager=b + 2, remediate=b + 3, node_base=b + 4,
                  engine_base=b + 14, grafana=b + 24, logwatch_base=b + 25)
    run = tmp_path / "run"
    out = io.StringIO()
    state = supervisor.up(supervisor.StackConfig(run_dir=run, ports=ports, nodes=8, gpus=8, training_nodes=1,
                                                 profile="drill", remediate="enforce", timeout_s=120), out=out)
    try:
        results = rd.run_all(state, say=lambda m: None)
    finally:
        supervisor.down(run, out=out)
    for r in results:
        times = ", ".join(f"{k} {v:g} s" for k, v in r.times.items() if v is not None)
        record("remediation", r.name, f"{times}; worst out {r.worst_out}; " + "; ".join(r.checks + r.problems),
               r.passed)
    print(rd.format_table(results))
    assert all(r.passed for r in results), rd.format_table(results)
    assert not supervisor.find_processes(state, "remediate")
