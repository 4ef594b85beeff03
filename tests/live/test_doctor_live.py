"""Live: ``gpuobs doctor`` against the native stack (real Prometheus scraping the simulated exporters).

One small stack (2 nodes x 2 GPUs, one of them training) per case; doctor must name exactly the families
that are blind or degraded there (:data:`EXPECTED`) and exactly the error/warning findings
(:data:`FINDINGS`). Where the stack has exporter profiles (StackConfig.exporter_profile, issue 10 item 1)
the cases are stock, helm, recommended and kube-prometheus-style stock (ServiceMonitor labels, pod-name
Hostname); before that, the stack's one page ("default"). A new case is one line in CASES plus its
expected row.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from gpuobs.doctor import run
from gpuobs.mixin.families import FAMILIES
from gpuobs.stack import supervisor
from tests.conftest import live_stack

pytestmark = pytest.mark.live

ALL_LIVE = {f.name: "live" for f in FAMILIES}
STOCK = {**ALL_LIVE, "xid": "degraded", "gpu-missing": "degraded", "ecc": "degraded", "throttling": "degraded",
         "interconnect": "degraded", "collective-hang": "degraded", "memory": "degraded"}
SERVICEMONITOR = {"dcgm_selector": 'job="nvidia-dcgm-exporter"', "vllm_selector": 'job=~"vllm.*"'}

HAS_PROFILES = "exporter_profile" in {f.name for f in dataclasses.fields(supervisor.StackConfig)}
#: case -> (StackConfig fields, doctor keyword arguments)
CASES = {
    "stock": ({"exporter_profile": "stock"}, {}),
    "helm": ({"exporter_profile": "helm"}, {}),
    "recommended": ({"exporter_profile": "recommended"}, {}),
    "stock-servicemonitor-podname": ({"exporter_profile": "stock", "scrape_mode": "servicemonitor",
                                      "host_label_mode": "pod"}, SERVICEMONITOR),
    # the fleet config names an identity label the scrapes do not set (a relabelling missing)
    "stock-without-identity": ({"exporter_profile": "stock"}, {"identity_label": "k8s_node"}),
} if HAS_PROFILES else {"default": ({}, {})}
#: case -> doctor's verdicts on that stack.
EXPECTED = {
    # Before exporter profiles: every DCGM field and gpuobs extra, but no DCGM_EXP_XID_ERRORS_COUNT series
    # before the first Xid and no kernel-log agent, so only the Xid family runs on its stock path.
    "default": {**ALL_LIVE, "xid": "degraded"},
    "stock": STOCK,
    "helm": {**STOCK, "driver-skew": "blind"},
    "recommended": ALL_LIVE,
    "stock-servicemonitor-podname": STOCK,
    # The alerts' degraded twins page every target named by its instance: degraded, not blind, except
    # the families whose alerts all read per-node recordings (issue 32).
    "stock-without-identity": {**STOCK, "throttling": "blind", "driver-skew": "blind", "kv-cache": "degraded",
                               "exporter": "degraded"},
}
#: case -> the error/warning findings (none where file_sd gives every target `node`).
FINDINGS = {"helm": ["driver-label-missing"], "stock-servicemonitor-podname": ["hostname-pod-name"],
            "stock-without-identity": ["dcgm-identity-missing", "vllm-identity-missing"]}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    cfg, doctor_kw = CASES[request.param]
    # logwatch off: these cases judge what each DCGM exporter profile serves (the kernel-log agent would
    # add the xid / gpu-missing alternatives on every profile).
    for state in live_stack(tmp_path_factory, f"doctor-{request.param}", nodes=2, gpus=2, training_nodes=1,
                            timeout_s=120, logwatch=False, **cfg):
        yield request.param, state, doctor_kw


def test_doctor_names_exactly_the_blind_and_degraded_families(case):
    name, stack, doctor_kw = case
    deadline = time.time() + 90
    while True:  # wait for the first scrapes of every target (and the engines' first requests)
        report = run(stack.urls.prometheus, retries=0, **doctor_kw)
        got = {f.name: f.status for f in report.families}
        ready = report.targets["dcgm"]["up"] == 2 and report.targets["vllm"]["up"] == 1
        if (ready and got == EXPECTED[name]) or time.time() > deadline:
            break
        time.sleep(2)
    assert report.targets == {"dcgm": {"matched": 2, "up": 2}, "vllm": {"matched": 1, "up": 1}}
    assert got == EXPECTED[name], [(f.name, f.status, f.why) for f in report.families]
    assert [f.code for f in report.findings if f.severity in ("error", "warning")] == FINDINGS.get(name, [])
    assert report.exit_code == 0
