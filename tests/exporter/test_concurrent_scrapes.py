"""Concurrent scrapes are safe: 8 scraper threads on one node server while another thread injects
and clears faults over the admin API and a ticker advances the simulation. Every page must parse
with prometheus_client's parser and report every collector healthy; no request may fail."""

from __future__ import annotations

import itertools
import threading

import requests
from prometheus_client.parser import text_string_to_metric_families

from gpuobs.exporter.collectors.dcgm import DcgmCollector
from gpuobs.exporter.server import NodeServer
from gpuobs.exporter.sim.node import Node, NodeConfig
from tests.conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SCRAPERS = 8
SCRAPES_EACH = 25
# Faults that change labels (driver, Xid err_code/err_msg), drop a GPU (Xid 79) or move values.
FAULTS = [
    {"kind": "driver", "version": "580.95.05"},
    {"kind": "xid", "gpu": 1, "code": 79},
    {"kind": "xid", "gpu": 2, "code": 48},
    {"kind": "ecc-dbe", "gpu": 3, "count": 1},
    {"kind": "thermal", "gpu": 0, "cooling_factor": 3},
    {"kind": "fragmentation", "gpu": 2, "rate_mib_per_min": 4096},
    {"kind": "row-remap-failure", "gpu": 1},
]


def test_concurrent_scrapes_with_faults_and_ticker():
    node = Node(NodeConfig(index=0, gpus=4, seed=11))
    srv = NodeServer(("127.0.0.1", 0), node, TOKEN, DcgmCollector(node, profile="recommended"))
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    stop = threading.Event()
    errors: list[str] = []
    pages: list[int] = []
    fault_ops = itertools.count()

    def ticker() -> None:
        while not stop.is_set():
            node.advance(0.5)
            stop.wait(0.002)

    def faulter() -> None:
        with requests.Session() as s:
            for body in itertools.cycle(FAULTS):
                if stop.is_set():
                    return
                r = s.post(f"{url}/admin/faults", json=body, headers=AUTH, timeout=10)
                if r.status_code != 201:
                    errors.append(f"inject {body}: {r.status_code} {r.text}")
                    return
                r2 = s.delete(f"{url}/admin/faults/{r.json()['id']}", headers=AUTH, timeout=10)
                if r2.status_code != 200:
                    errors.append(f"clear {body}: {r2.status_code} {r2.text}")
                    return
                next(fault_ops)

    def scraper() -> None:
        with requests.Session() as s:
            for _ in range(SCRAPES_EACH):
                try:
                    r = s.get(f"{url}/metrics", timeout=10)
                    assert r.status_code == 200, r.status_code
                    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
                    success = fams["gpuobs_exporter_collector_success"].samples
                    ok = {smp.labels["collector"]: smp.value for smp in success}
                    assert set(ok.values()) == {1}, ok
                    gpus = {smp.labels["gpu"] for smp in fams["DCGM_FI_DEV_GPU_TEMP"].samples}
                    assert gpus in ({"0", "1", "2", "3"}, {"0", "2", "3"}), gpus  # GPU 1 may be off the bus
                    pages.append(len(r.text))
                except Exception as exc:  # collected: an assertion in a thread would be lost
                    errors.append(f"scrape: {exc!r}")
                    return

    background = [threading.Thread(target=ticker, daemon=True), threading.Thread(target=faulter, daemon=True)]
    scrapers = [threading.Thread(target=scraper, daemon=True) for _ in range(SCRAPERS)]
    for t in background + scrapers:
        t.start()
    try:
        for t in scrapers:
            t.join(timeout=120)
    finally:
        stop.set()
        for t in background:
            t.join(timeout=10)
        srv.shutdown()
        srv.server_close()
    assert errors == []
    assert len(pages) == SCRAPERS * SCRAPES_EACH
    cycles = next(fault_ops)
    assert cycles > 0, "the fault thread never completed an inject/clear cycle"
    assert node.faults == {}
