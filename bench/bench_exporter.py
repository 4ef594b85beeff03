"""Exporter benchmark (issue 3 item 12): cost per served sample, and a 512-node scale check.

Run ``python bench/bench_exporter.py [--quick]`` (``make bench``). In one run it measures, over HTTP
on 127.0.0.1, the wall time of a scrape divided by the samples on the page (median over repeated
scrapes, the targets interleaved round by round so machine noise hits them alike). Every exporter
runs in its own process, apart from the scraping client (as Prometheus would be), for:

* ours, one 8-GPU node's DCGM page (a 1-node fleet);
* ours, one process serving 64 nodes x 8 GPUs, every node's page scraped in turn (one sweep);
* Debian's ``prometheus-node-exporter`` (installed with apt-get when missing and run as root;
  otherwise that column is skipped, saying how to install it);
* a plain prometheus_client custom collector building GaugeMetricFamily objects for the same
  8-GPU DCGM content on every scrape, served by prometheus_client's ``start_http_server``.

Then a scale check: one process serving 512 nodes x 8 GPUs (DCGM and engine pages), every page
scraped once per 15 s window by a few scraper threads with targets spread over the window, as
Prometheus spreads them; it prints p50/p99 scrape latency and the ticker's lag behind wall time.
Numbers only: nothing here asserts a timing. Goals (issue 3): ours <= 1/5 of node_exporter's cost
per sample; p99 < 1 s at 512 nodes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry, start_http_server  # noqa: E402
from prometheus_client.core import GaugeMetricFamily  # noqa: E402
from prometheus_client.registry import Collector  # noqa: E402

from gpuobs.exporter.collectors import dcgm as collmod  # noqa: E402
from gpuobs.reference.dcgm_exporter import xid_text  # noqa: E402
from gpuobs.exporter.simfleet import SimFleet, SimFleetSpec  # noqa: E402
from gpuobs.exporter.sim.node import Node, NodeConfig  # noqa: E402
from gpuobs.stack.ports import free_port_range  # noqa: E402

NODE_EXPORTER = "prometheus-node-exporter"
ACCEPT = "text/plain;version=0.0.4"  # text format for all three; no gzip (ours does not compress)


# ---- plumbing -------------------------------------------------------------------------------
def build_fleet(nodes: int, engine: bool) -> SimFleet:
    """A fleet of ``nodes`` x 8 GPUs on free ports; retries when another process takes a port first."""
    for attempt in range(6):
        base = free_port_range(nodes, start=12000 + attempt * 3000)
        eng = free_port_range(nodes, start=base + nodes) if engine else None
        try:
            # the recommended profile: the largest DCGM page (stock fields + extras + allocator)
            return SimFleet(SimFleetSpec(nodes=nodes, gpus=8, base_port=base, engine_base_port=eng,
                                     exporter_profile="recommended"), "bench")
        except OSError:
            continue
    raise RuntimeError(f"could not bind {nodes} node ports on 127.0.0.1")


class Scraper:
    """A keep-alive HTTP client for one target (reconnects when the server closes), like Prometheus."""

    def __init__(self, port: int, path: str = "/metrics"):
        self.port, self.path, self.conn = port, path, None

    def scrape(self) -> tuple[float, bytes]:
        """(wall seconds from request to the last byte read, body)."""
        t0 = time.perf_counter()
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            self.conn.request("GET", self.path, headers={"Accept": ACCEPT})
            resp = self.conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if resp.status != 200:
            raise RuntimeError(f"127.0.0.1:{self.port}{self.path} answered {resp.status}")
        if resp.will_close:
            self.close()
        return time.perf_counter() - t0, body

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def count_samples(body: bytes) -> int:
    return sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))


def wait_http(port: int, path: str = "/metrics", timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            Scraper(port, path).scrape()
            return
        except (OSError, RuntimeError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# ---- baselines ------------------------------------------------------------------------------
def ensure_node_exporter() -> tuple[str | None, str]:
    """Path of prometheus-node-exporter (installing it with apt-get when root), or None and why."""
    path = shutil.which(NODE_EXPORTER) or next(
        (p for p in (f"/usr/bin/{NODE_EXPORTER}", f"/usr/sbin/{NODE_EXPORTER}") if os.access(p, os.X_OK)), None)
    if path:
        return path, ""
    how = f"install it with: sudo apt-get install -y --no-install-recommends {NODE_EXPORTER}"
    if os.geteuid() != 0:
        return None, f"{NODE_EXPORTER} not found and not root; {how}"
    print(f"# {NODE_EXPORTER} missing; running apt-get install (root) ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    r = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", NODE_EXPORTER],
                       capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env, timeout=300)
        r = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", NODE_EXPORTER],
                           capture_output=True, text=True, env=env, timeout=300)
    path = shutil.which(NODE_EXPORTER) or (f"/usr/bin/{NODE_EXPORTER}"
                                           if os.access(f"/usr/bin/{NODE_EXPORTER}", os.X_OK) else None)
    if path:
        return path, ""
    why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    return None, f"apt-get install failed ({why}); {how}"


def start_node_exporter(path: str) -> tuple[subprocess.Popen, int, str]:
    port = free_port_range(1)
    proc = subprocess.Popen([path, f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    wait_http(port)
    return proc, port, (version[0] if version else "?")


class DcgmLikeCollector(Collector):
    """The same 8-GPU DCGM content as ours, as a plain prometheus_client collector: families are
    built from the node's state on every scrape (GaugeMetricFamily, one add_metric per sample)."""

    def __init__(self, node: Node):
        self.node = node
        self.dcgm = collmod.DcgmCollector(node, profile="recommended")  # only for its label helper

    def collect(self):
        node = self.node
        with node.lock:
            present = [g for g in node.gpus if g.present]
            idents = [self.dcgm.identity_labels(g) for g in present]
            names = [k for k, _ in idents[0]] if idents else []
            for name, _t, _i, help_text, get in collmod.DCGM_FIELDS:
                fam = GaugeMetricFamily(name, help_text, labels=names)
                for g, ident in zip(present, idents):
                    fam.add_metric([v for _, v in ident], get(g))
                yield fam
            xid = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", collmod.XID_HELP, labels=names + ["err_code", "err_msg"])
            count = GaugeMetricFamily("DCGM_EXP_XID_ERRORS_COUNT", collmod.XID_COUNT_HELP,
                                      labels=names + ["window_size_in_ms", "xid"])
            for g, ident in zip(present, idents):
                last = g.last_xid
                if last is not None:  # no series before the first Xid (dcgm-exporter 4.4+)
                    xid.add_metric([v for _, v in ident] + [str(last.code), xid_text(last.code)], last.code)
                window = str(node.cfg.xid_window_ms)
                counts = sorted(g.xid_counts().items())
                if not counts:  # one 0 series without `xid` (expcollector.go)
                    zero = GaugeMetricFamily("DCGM_EXP_XID_ERRORS_COUNT", collmod.XID_COUNT_HELP,
                                             labels=names + ["window_size_in_ms"])
                    zero.add_metric([v for _, v in ident] + [window], 0)
                    count.samples.extend(zero.samples)
                for c, n in counts:
                    count.add_metric([v for _, v in ident] + [window, str(c)], n)
            yield xid
            yield count
            for name, _t, help_text, get in collmod.ALLOCATOR_FIELDS:
                fam = GaugeMetricFamily(name, help_text, labels=names)
                for g, ident in zip(present, idents):
                    fam.add_metric([v for _, v in ident], get(g))
                yield fam
            ok = GaugeMetricFamily("gpuobs_exporter_collector_success", "Whether a collector succeeded.",
                                   labels=["Hostname", "collector"])
            for c in ("dcgm", "xid", "allocator", "training"):
                ok.add_metric([node.hostname, c], 1)
            yield ok
            yield _expected(node)


def _expected(node: Node) -> GaugeMetricFamily:
    fam = GaugeMetricFamily("gpuobs_node_expected_gpus", "GPUs the node should have.", labels=["Hostname"])
    fam.add_metric([node.hostname], len(node.gpus))
    return fam


def start_prometheus_client() -> tuple[object, int]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DcgmLikeCollector(Node(NodeConfig(index=0, gpus=8, seed=1))))
    port = free_port_range(1, start=20000)
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    wait_http(port)
    return server, port


# ---- exporters in child processes -----------------------------------------------------------
def serve_child(kind: str, nodes: int, engine: bool) -> None:
    """Child process: serve, print one JSON line with the ports, run until stdin closes, then print
    one JSON line of statistics (fleet: tick durations and how far sim time trailed wall time)."""
    if kind == "pyclient":
        _server, port = start_prometheus_client()
        print(json.dumps({"port": port}), flush=True)
        sys.stdin.read()
        print("{}", flush=True)
        return
    fleet = build_fleet(nodes, engine)
    fleet.start()
    t0, sim0 = time.monotonic(), [n.now for n in fleet.nodes]
    lags: list[float] = []
    stop = threading.Event()

    def monitor() -> None:  # how far the simulated clock trails the wall clock
        while not stop.wait(0.25):
            wall = time.monotonic() - t0
            lags.append(max(wall - (n.now - s0) for n, s0 in zip(fleet.nodes, sim0)))

    threading.Thread(target=monitor, daemon=True).start()
    print(json.dumps({"port": fleet.cfg.base_port, "engine_port": fleet.cfg.engine_base_port}), flush=True)
    sys.stdin.read()
    stop.set()
    print(json.dumps({"ticks": list(fleet.tick_seconds), "lags": lags}), flush=True)
    os._exit(0)  # no orderly shutdown of hundreds of servers needed


class Child:
    """An exporter in its own process (this script with ``--serve``)."""

    def __init__(self, kind: str, nodes: int = 1, engine: bool = False):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", kind, "--scale-nodes", str(nodes)]
        self.proc = subprocess.Popen(cmd + (["--engine"] if engine else []), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"exporter child {kind} exited with {self.proc.returncode} before serving")
        self.info = json.loads(line)

    def finish(self) -> dict:
        """Stop the child; its statistics."""
        self.proc.stdin.close()
        line = self.proc.stdout.readline()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return json.loads(line) if line.strip() else {}


# ---- cost per sample ------------------------------------------------------------------------
def cost_phase(rounds: int, ne_port: int | None) -> dict[str, dict]:
    children = [Child("fleet", 1), Child("fleet", 64), Child("pyclient")]
    try:
        one, many, pc = (c.info["port"] for c in children)
        targets: dict[str, list[Scraper]] = {
            "ours: 8-GPU node page": [Scraper(one)],
            "ours: 64 nodes x 8 GPUs, one process": [Scraper(many + i) for i in range(64)],
            "prometheus_client collector (8 GPUs)": [Scraper(pc)],
        }
        if ne_port is not None:
            targets["node_exporter"] = [Scraper(ne_port)]
        for scrapers in targets.values():
            for sc in scrapers:
                wait_http(sc.port)
        walls: dict[str, list[float]] = {k: [] for k in targets}
        samples: dict[str, list[int]] = {k: [] for k in targets}
        nbytes: dict[str, int] = {}
        for r in range(rounds + 5):
            for key, scrapers in targets.items():
                total, n, b = 0.0, 0, 0
                for sc in scrapers:
                    wall, body = sc.scrape()
                    total += wall
                    n += count_samples(body)
                    b += len(body)
                if r >= 5:  # first rounds warm connections and caches
                    walls[key].append(total)
                    samples[key].append(n)
                    nbytes[key] = b
    finally:
        for c in children:
            c.finish()
    out = {}
    for key in targets:
        per = [w / n for w, n in zip(walls[key], samples[key])]
        out[key] = {"us_per_sample": statistics.median(per) * 1e6, "samples": int(statistics.median(samples[key])),
                    "ms": statistics.median(walls[key]) * 1e3, "bytes": nbytes[key], "pages": len(targets[key])}
    return out


# ---- scale check ----------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def scale_phase(nodes: int, windows: int, interval: float, workers: int) -> dict:
    t_build = time.monotonic()
    child = Child("fleet", nodes, engine=True)
    build_s = time.monotonic() - t_build
    targets = [("dcgm", child.info["port"] + i) for i in range(nodes)]
    targets += [("vllm", child.info["engine_port"] + i) for i in range(nodes)]
    # Spread targets over the interval (Prometheus offsets each target by a hash of its labels).
    order = sorted(range(len(targets)), key=lambda k: (k * 2654435761) % 2**32)
    offsets = {k: interval * j / len(targets) for j, k in enumerate(order)}
    lat: dict[str, list[float]] = {"dcgm": [], "vllm": []}
    late: list[float] = []
    errors: list[str] = []
    start = time.monotonic() + 1.0

    def worker(w: int) -> None:
        mine = sorted((k for k in range(len(targets)) if k % workers == w), key=lambda k: offsets[k])
        scrapers = {k: Scraper(targets[k][1]) for k in mine}
        for win in range(windows):
            for k in mine:
                delay = start + win * interval + offsets[k] - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                late.append(max(0.0, -delay))
                try:
                    wall, _ = scrapers[k].scrape()
                    lat[targets[k][0]].append(wall)
                except Exception as exc:  # recorded, not raised: the bench reports errors
                    errors.append(f"{targets[k]}: {exc!r}")
        for sc in scrapers.values():
            sc.close()

    try:
        threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stats = child.finish()
    ticks, lags = stats.get("ticks", []), stats.get("lags", [])
    return {"nodes": nodes, "windows": windows, "interval": interval, "workers": workers, "build_s": build_s,
            "lat": {k: (len(v), pct(v, 0.5), pct(v, 0.99), max(v, default=float("nan"))) for k, v in lat.items()},
            "late_p99": pct(late, 0.99), "late_max": max(late, default=0.0), "errors": errors,
            "lag_max": max(lags, default=float("nan")), "lag_p50": pct(lags, 0.5),
            "tick_p50": pct(ticks, 0.5), "tick_max": max(ticks, default=float("nan")), "ticks": len(ticks)}


# ---- report ---------------------------------------------------------------------------------
def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and one 15 s window (about 1 minute)")
    ap.add_argument("--rounds", type=int, help="scrape rounds for the cost table (default 150, quick 30)")
    ap.add_argument("--scale-nodes", type=int, default=512)
    ap.add_argument("--windows", type=int, help="15 s windows in the scale check (default 4, quick 1)")
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument("--scrapers", type=int, default=4, help="concurrent scraper threads in the scale check")
    ap.add_argument("--serve", choices=("fleet", "pyclient"), help=argparse.SUPPRESS)
    ap.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve_child(args.serve, args.scale_nodes, args.engine)
        return 0
    rounds = args.rounds or (30 if args.quick else 150)
    windows = args.windows or (1 if args.quick else 4)
    started = time.monotonic()

    print("# gpuobs exporter benchmark" + (" (--quick)" if args.quick else ""))
    print(f"# conditions: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), load average "
          f"{loadavg()} at start, Python {platform.python_version()}, prometheus_client {version('prometheus_client')};"
          " each exporter in its own process, scraped over 127.0.0.1 by keep-alive clients in this one,"
          " text format 0.0.4, no gzip")

    ne_path, ne_note = ensure_node_exporter()
    ne_proc, ne_port, ne_version = (None, None, "")
    if ne_path:
        ne_proc, ne_port, ne_version = start_node_exporter(ne_path)
        print(f"# node_exporter: {ne_path} ({ne_version}), default collectors")
    else:
        print(f"# node_exporter column SKIPPED: {ne_note}")
    try:
        cost = cost_phase(rounds, ne_port)
    finally:
        if ne_proc is not None:
            ne_proc.terminate()
            ne_proc.wait(timeout=10)

    print(f"\n## Cost per served sample (median of {rounds} interleaved scrape rounds)\n")
    print("| target | pages | samples/scrape | bytes/scrape | ms/scrape | µs/sample |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, r in cost.items():
        print(f"| {key} | {r['pages']} | {r['samples']} | {r['bytes']} | {r['ms']:.2f} | {r['us_per_sample']:.3f} |")
    print("\n| ratio (same run) | ours 8-GPU node | ours 64 nodes |")
    print("|---|---:|---:|")
    ours = [cost["ours: 8-GPU node page"]["us_per_sample"],
            cost["ours: 64 nodes x 8 GPUs, one process"]["us_per_sample"]]
    for key in ("node_exporter", "prometheus_client collector (8 GPUs)"):
        if key in cost:
            base = cost[key]["us_per_sample"]
            print(f"| ours / {key.split(' (')[0]} | {ours[0] / base:.3f} | {ours[1] / base:.3f} |")
        else:
            print(f"| ours / {key} | skipped | skipped |")
    if "node_exporter" in cost:
        goal = max(ours) / cost["node_exporter"]["us_per_sample"] <= 0.2
        print(f"\nGoal cost <= 1/5 of node_exporter's: {'met' if goal else 'NOT met'}")

    print(f"\n## Scale: {args.scale_nodes} nodes x 8 GPUs in one process, {args.interval:g} s scrape interval",
          flush=True)
    s = scale_phase(args.scale_nodes, windows, args.interval, args.scrapers)
    print(f"(fleet built in {s['build_s']:.1f} s; {s['windows']} window(s) x {s['interval']:g} s; "
          f"{s['workers']} scraper threads; every DCGM and engine page once per window)\n")
    print("| page | scrapes | p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for k, (n, p50, p99, mx) in s["lat"].items():
        print(f"| {k} | {n} | {p50 * 1e3:.1f} | {p99 * 1e3:.1f} | {mx * 1e3:.1f} |")
    print(f"\nScrape start lateness vs schedule: p99 {s['late_p99'] * 1e3:.1f} ms, max {s['late_max'] * 1e3:.1f} ms; "
          f"errors: {len(s['errors'])}" + (f" (first: {s['errors'][0]})" if s["errors"] else ""))
    print(f"Ticker: {s['ticks']} ticks, one tick (advance all {s['nodes']} nodes) p50 {s['tick_p50'] * 1e3:.0f} ms, "
          f"max {s['tick_max'] * 1e3:.0f} ms (busy {100 * s['tick_p50'] / (1 + s['tick_p50']):.0f}% of the time); "
          f"simulated clock behind wall clock: median {s['lag_p50']:.2f} s, max {s['lag_max']:.2f} s "
          "(bounded by the 1 s tick + one tick's work, not growing: the simulation keeps real time)")
    p99 = s["lat"]["dcgm"][2]
    print(f"Goal p99 < 1 s at {s['nodes']} nodes: {'met' if p99 < 1.0 and not s['errors'] else 'NOT met'}")
    print(f"\n# load average at end {loadavg()}; total bench time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
