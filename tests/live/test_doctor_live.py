"""Live: ``gpuobs doctor`` against the native stack (real Prometheus scraping the simulated exporters).

One small stack per exporter profile in :data:`PROFILES`; doctor must name exactly the families that are
blind or degraded there (:data:`EXPECTED`), with no identity or selector finding (the stack's file_sd
gives every target ``node``). ``None`` is the stack's default page. When ``gpuobs stack up
--exporter-profile`` lands (issue 10 item 1), adding a profile is one line: put its name in PROFILES
(StackConfig's ``exporter_profile`` field carries it); its expected verdicts are already below.
"""

from __future__ import annotations

import time

import pytest

from gpuobs.doctor import run
from gpuobs.mixin.families import FAMILIES
from tests.conftest import live_stack

pytestmark = pytest.mark.live

ALL_LIVE = {f.name: "live" for f in FAMILIES}
STOCK = {**ALL_LIVE, "xid": "degraded", "gpu-missing": "degraded", "ecc": "degraded", "throttling": "degraded",
         "interconnect": "degraded", "collective-hang": "degraded", "memory": "degraded"}
#: profile -> doctor's verdicts on that stack.
EXPECTED = {
    # Today's page: every DCGM field and gpuobs extra, but no DCGM_EXP_XID_ERRORS_COUNT series before the
    # first Xid and no kernel-log agent, so only the Xid family runs on its stock path.
    None: {**ALL_LIVE, "xid": "degraded"},
    "stock": STOCK,
    "helm": {**STOCK, "driver-skew": "blind"},
    "recommended": ALL_LIVE,
}
PROFILES = [None]  # add "stock", "helm", "recommended" here once `stack up --exporter-profile` exists


@pytest.fixture(scope="module", params=PROFILES, ids=lambda p: p or "default")
def stack(request, tmp_path_factory):
    extra = {"exporter_profile": request.param} if request.param else {}
    yield from live_stack(tmp_path_factory, f"doctor-{request.param or 'default'}", nodes=2, gpus=2,
                          training_nodes=1, timeout_s=120, **extra)


def test_doctor_names_exactly_the_blind_and_degraded_families(stack, request):
    profile = request.node.callspec.params["stack"]
    url = stack.urls.prometheus
    deadline = time.time() + 90
    while True:  # wait for the first scrapes of every target (and the engines' first requests)
        report = run(url, retries=0)
        got = {f.name: f.status for f in report.families}
        ready = report.targets["dcgm"]["up"] == 2 and report.targets["vllm"]["up"] == 1
        if (ready and got == EXPECTED[profile]) or time.time() > deadline:
            break
        time.sleep(2)
    assert report.targets == {"dcgm": {"matched": 2, "up": 2}, "vllm": {"matched": 1, "up": 1}}
    assert got == EXPECTED[profile], [(f.name, f.status, f.why) for f in report.families]
    assert [f.code for f in report.findings if f.severity in ("error", "warning")] == []
    assert report.exit_code == 0
