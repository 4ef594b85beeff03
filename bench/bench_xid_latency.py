"""Fault-to-page latency of the Xid alert, measured end to end on a real native stack.

Starts its own stack (free loopback ports, temporary run directory; the default stack, whose nodes run
logwatch, so the kernel-log path pages: GpuKernelXidCritical, or GpuXidCritical without logwatch),
injects Xid 48 ten times on ten distinct GPUs and measures injection -> alert firing in Prometheus ->
notification stored by the pager. Alertmanager groups a GPU's hardware alerts by (node, gpu), so every
run starts a fresh group and pays group_wait, never group_interval. Prints median and max next to the
bound the stack implies, scrape_interval + evaluation_interval + group_wait (gpuobs/drills/bounds.py),
and the product's figure as a share of it.

Run: ``python bench/bench_xid_latency.py`` (about 4 minutes). Numbers only; no assertions.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuobs.core.fleet import shipped_fleet  # noqa: E402
from gpuobs.drills.bounds import page_bound  # noqa: E402
from gpuobs.promapi.alertmanager import AlertsClient, PagerClient  # noqa: E402
from gpuobs.promapi.exporter_admin import AdminClient  # noqa: E402
from gpuobs.stack import supervisor  # noqa: E402
from gpuobs.stack.render import Ports  # noqa: E402

from gpuobs.stack.ports import free_port_range  # noqa: E402

RUNS = 10


def _poll(fn, deadline_s: float, every: float = 0.25):
    end = time.time() + deadline_s
    while time.time() < end:
        got = fn()
        if got:
            return got
        time.sleep(every)
    return None


def main() -> int:
    base = free_port_range(16)
    ports = Ports(prometheus=base, alertmanager=base + 1, pager=base + 2, node_base=base + 3, engine_base=base + 10)
    with tempfile.TemporaryDirectory() as tmp:
        state = supervisor.up(supervisor.StackConfig(run_dir=Path(tmp), nodes=5, gpus=2, training_nodes=0, exporter_profile="recommended",
                                                     ports=ports), out=sys.stderr)
        try:
            token = state.token()
            admins = [AdminClient(u, token) for u in state.urls.node_bases]
            alerts_api, pager_api = AlertsClient(state.urls.prometheus), PagerClient(state.urls.pager)
            rows = []
            alertname = "GpuKernelXidCritical" if state.logwatch else "GpuXidCritical"
            ident = shipped_fleet().identity_label
            bound = page_bound(state.urls.prometheus, state.urls.alertmanager, alertname,
                               {"severity": "critical", "family": "xid"})
            for i in range(RUNS):
                node, gpu = i % 5, i // 5
                host = state.hostnames[node]
                t0 = time.time()
                fid = admins[node].inject({"kind": "xid", "gpu": gpu, "code": 48})["id"]

                def firing():
                    alerts = alerts_api.alerts()
                    return any(a["state"] == "firing" and a["labels"].get("alertname") == alertname
                               and a["labels"].get(ident) == host and a["labels"].get("gpu") == str(gpu)
                               for a in alerts)

                def paged():
                    for p in pager_api.pages():
                        if p["received_at"] >= t0 and p["status"] == "firing" and any(
                                a["labels"].get(ident) == host and a["labels"].get("gpu") == str(gpu)
                                for a in p["alerts"]):
                            return p["received_at"]
                    return None

                fired = _poll(firing, 60) and time.time() - t0
                page_at = _poll(paged, 60)
                rows.append((i + 1, host, gpu, fired, page_at - t0 if page_at else None))
                admins[node].clear(fid)
            to_page = [r[4] for r in rows if r[4] is not None]
            to_fire = [r[3] for r in rows if r[3]]
        finally:
            supervisor.down(Path(tmp), out=sys.stderr)
    print(f"Xid 48 fault-to-page through {alertname}, {RUNS} runs; bound {bound.text() if bound else '-'} "
          "(scrape + evaluation + for + group_wait)")
    print(f"{'run':>3} {'host':<12} {'gpu':>3} {'to firing s':>11} {'to page s':>9}")
    for n, host, gpu, f, p in rows:
        print(f"{n:>3} {host:<12} {gpu:>3} {f if f else float('nan'):>11.1f} {p if p else float('nan'):>9.1f}")
    print(f"to firing: median {statistics.median(to_fire):.1f}s, max {max(to_fire):.1f}s")
    share = f"; max = {max(to_page) / bound.seconds:.0%} of the bound" if bound and to_page else ""
    print(f"to page:   median {statistics.median(to_page):.1f}s, max {max(to_page):.1f}s; "
          f"bound {bound.seconds:g}s{share}; paged {len(to_page)}/{RUNS}" if bound else
          f"to page:   median {statistics.median(to_page):.1f}s, max {max(to_page):.1f}s; paged {len(to_page)}/{RUNS}")
    return 0 if len(to_page) == RUNS else 1


if __name__ == "__main__":
    sys.exit(main())
