"""The HA topology at scale against the single stack, one run (``make bench-scale``; not in ``make test``).

Two phases on the same simulated fleet (``--nodes`` x ``--gpus``, serving and training nodes mixed,
one in ``--training-every`` training; exporter profile ``recommended``; no logwatch agents), each on
free loopback ports in a temporary run directory, stopped afterwards:

1. **HA** (gpuobs.stack.ha): ``--shards`` x 2 Prometheus replicas, 3 Alertmanagers, VictoriaMetrics,
   vmalert, every interval ``--interval`` s. A bench-only vmalert rule file adds
   ``BenchXidViaVmalert``, GpuXidCritical's own expression evaluated by vmalert over VictoriaMetrics,
   so one injected Xid pages twice, once per path (shard and vmalert), and the two latencies compare
   the paths on the same fault.
2. **single** (gpuobs.stack.supervisor): one Prometheus, one Alertmanager, the same fleet; its
   scrape/evaluation interval is set to ``--interval`` by editing the rendered config and SIGHUP.

Per phase, after a warm-up of ``--warmup`` s: a measuring window of ``--window`` s reads every
member's own counters at both ends (``prometheus_tsdb_head_samples_appended_total`` per replica;
VictoriaMetrics's ``vm_rows_inserted_total{type="promremotewrite"}`` and ``vm_deduplicated_samples_total``),
the head series (``prometheus_tsdb_head_series``; VictoriaMetrics ``vm_cache_entries{type=
"storage/hour_metric_ids"}``, the series active this hour), and CPU (utime+stime from /proc, in
cores) and RSS of every process. Then the canary's full look (gpuobs.canary.analyzer.Analyzer with
the shipped metrics config, canary ``node="gpu-node-00"`` vs the other serving nodes, last 5 min)
``--looks`` times against VictoriaMetrics (HA) and against the single Prometheus, median wall time
and the median look's HTTP query time per kind of query (first-sample, increase, sample-count, range);
then Xid 48 on GPU 0 of ``--xid-nodes`` nodes at once, fault-to-page seconds per path (pager
``received_at`` minus the wall-clock time just before the fault was injected), split at the first scrape
of the node after the fault (the raw ``up`` sample's timestamp: the scrape wait is the fault's random
phase, the rest is the pipeline), with the median per path, its ratio to the single stack and the bound
from the settings.

Prints Markdown tables (and ``--json FILE`` the raw numbers). Numbers only; no assertions.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuobs.canary.analyzer import Analyzer  # noqa: E402
from gpuobs.canary.config import load_config  # noqa: E402
from gpuobs.promapi.exporter_admin import AdminClient  # noqa: E402
from gpuobs.promapi.prometheus import PromClient  # noqa: E402
from gpuobs.stack import ha, supervisor  # noqa: E402
from gpuobs.stack.ports import free_port_range  # noqa: E402
from gpuobs.stack.render import Ports  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def counters(url: str) -> dict[str, float]:
    """Name{labels} -> value of the samples on ``url``/metrics we need (flat dict)."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    want = ("prometheus_tsdb_head_samples_appended_total", "prometheus_tsdb_head_series", "vm_rows_inserted_total",
            "vm_deduplicated_samples_total", "vm_cache_entries", "vm_rows_added_to_storage_total",
            "prometheus_remote_storage_samples_failed_total", "prometheus_remote_storage_samples_pending")
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(want):
                key = s.name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def proc_usage(pid: int) -> tuple[float, float]:
    """(CPU seconds used so far, RSS MiB) of ``pid`` from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / CLK
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS:")) / 1024
    return cpu, rss


def component_pids(state) -> dict[str, int]:
    return {name: supervisor.find_processes(state, name)[0] for name in state.components
            if supervisor.find_processes(state, name)}


def measure(state, urls: dict[str, str], window_s: float) -> dict:
    """Counters, CPU and RSS over ``window_s`` for the members in ``urls`` (name -> base URL)."""
    pids = component_pids(state)
    c0 = {n: counters(u) for n, u in urls.items()}
    u0 = {n: proc_usage(p) for n, p in pids.items()}
    t0 = time.monotonic()
    time.sleep(window_s)
    c1 = {n: counters(u) for n, u in urls.items()}
    u1 = {n: proc_usage(p) for n, p in pids.items()}
    dt = time.monotonic() - t0
    rows = {}
    for n in urls:
        a, b = c0[n], c1[n]
        row = {}
        if "prometheus_tsdb_head_samples_appended_total" in "".join(b):
            row["samples_per_s"] = sum(v for k, v in b.items() if k.startswith("prometheus_tsdb_head_samples_appended_total")) \
                - sum(v for k, v in a.items() if k.startswith("prometheus_tsdb_head_samples_appended_total"))
            row["samples_per_s"] /= dt
            row["head_series"] = b.get("prometheus_tsdb_head_series", 0)
            row["rw_failed"] = sum(v for k, v in b.items() if k.startswith("prometheus_remote_storage_samples_failed_total"))
            row["rw_pending"] = sum(v for k, v in b.items() if k.startswith("prometheus_remote_storage_samples_pending"))
        if 'vm_rows_inserted_total{type="promremotewrite"}' in b:
            k = 'vm_rows_inserted_total{type="promremotewrite"}'
            row["samples_per_s"] = (b[k] - a[k]) / dt
            k2 = "vm_rows_added_to_storage_total"
            row["stored_per_s"] = (b.get(k2, 0) - a.get(k2, 0)) / dt
            row["head_series"] = b.get('vm_cache_entries{type="storage/hour_metric_ids"}', 0)
            dd = sum(v for k, v in b.items() if k.startswith("vm_deduplicated_samples_total"))
            row["dedup_per_s"] = (dd - sum(v for k, v in a.items() if k.startswith("vm_deduplicated_samples_total"))) / dt
        rows[n] = row
    usage = {n: {"cpu_cores": (u1[n][0] - u0[n][0]) / dt, "rss_mib": u1[n][1]} for n in pids if n in u1}
    return {"window_s": dt, "members": rows, "usage": usage}


class TimedSession(requests.Session):
    """A requests.Session that records every request's wall time (request sent to body received; the
    client's JSON decoding and the analyzer's statistics are not in it) and its query's kind."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, float]] = []

    def request(self, method, url, *args, **kwargs):
        t0 = time.monotonic()
        try:
            return super().request(method, url, *args, **kwargs)
        finally:
            q = (kwargs.get("data") or kwargs.get("params") or {}).get("query", "")
            kind = ("range" if url.endswith("query_range") else "first-sample" if "timestamp(" in q
                    else "increase" if "increase(" in q else "sample-count" if "count_over_time(" in q else "other")
            self.calls.append((kind, time.monotonic() - t0))


def canary_looks(url: str, looks: int, serving_hosts: list[str], end: float | None = None) -> dict:
    """Median wall time of ``looks`` full canary looks against ``url`` (canary: the first of
    ``serving_hosts``, baseline: the others; window: the 5 min before ``end``, default now) and the
    last verdict with its per-metric classification, effect and sample counts; for the median look
    also its HTTP query time (``query_s``, per kind of query in ``query_s_by_kind``; the rest of the
    look is the client's decoding and the statistics)."""
    cfg = load_config()
    times, calls, verdict = [], [], None
    fixed_end = end
    for _ in range(looks):
        end = fixed_end or time.time()
        session = TimedSession()
        t0 = time.monotonic()
        v = Analyzer(PromClient(url, timeout=60, session=session), cfg, f'node="{serving_hosts[0]}"',
                     f'node=~"{"|".join(serving_hosts[1:])}"').analyze(end - 300, end)
        times.append(time.monotonic() - t0)
        calls.append(session.calls)
        verdict = v
    median = sorted(range(looks), key=times.__getitem__)[(looks - 1) // 2]
    by_kind: dict[str, list[float]] = {}
    for kind, s in calls[median]:
        by_kind.setdefault(kind, []).append(s)
    return {"median_s": statistics.median(times), "max_s": max(times), "times_s": times, "verdict": verdict.verdict,
            "queries": len(calls[median]), "query_s": sum(s for _, s in calls[median]),
            "query_s_by_kind": {k: {"n": len(v), "s": sum(v), "max_s": max(v)} for k, v in sorted(by_kind.items())},
            "metrics": {m.name: {"class": m.classification, "effect": m.effect, "n_canary": m.n_canary,
                                 "n_baseline": m.n_baseline, "baseline": m.baseline} for m in verdict.metrics}}


def shard_nodes(state, member: str) -> set[str]:
    """The node labels of the targets ``member`` scrapes."""
    ts = requests.get(f"{state.members[member]}/api/v1/targets", timeout=30).json()["data"]["activeTargets"]
    return {t["labels"].get("node") for t in ts}


def first_scrape_after(urls: list[str], node: str, after: float) -> float | None:
    """Wall-clock time of the first scrape of ``node``'s DCGM target at or after ``after`` by any of the
    Prometheus servers ``urls`` (the raw ``up`` samples' timestamps: Prometheus stamps a scrape with its
    start), or None. The exporter serves an injected fault from the next scrape on, so this is when the
    fault entered the monitoring pipeline."""
    first = None
    for url in urls:
        res = requests.get(f"{url}/api/v1/query", params={"query": f'up{{job="dcgm", node="{node}"}}[5m]'},
                           timeout=30).json()["data"]["result"]
        for series in res:
            ts = [float(t) for t, _v in series["values"] if float(t) >= after]
            if ts and (first is None or min(ts) < first):
                first = min(ts)
    return first


def xid_latency(state, nodes: list[int], alertnames: list[str], scrapers: list[str],
                deadline_s: float = 150) -> dict:
    """Inject Xid 48 on GPU 0 of ``nodes`` at once; per (alertname, node): seconds to the first firing
    page (``total``), of which ``scrape`` from the fault to the first scrape of the node by any of
    ``scrapers`` and ``after_scrape`` from that scrape to the page (evaluation, remote write and the
    global store's visibility on the vmalert path, group_wait, delivery)."""
    token = state.token()
    injected = {}
    for i in nodes:
        t = time.time()  # wall clock, like the pager's received_at (the fault's injected_at is simulated time)
        AdminClient(state.urls.node_bases[i], token).inject({"kind": "xid", "gpu": 0, "code": 48})
        injected[state.hostnames[i]] = t
    got: dict[str, float] = {}
    end = time.monotonic() + deadline_s
    want = {(a, h) for a in alertnames for h in injected}
    while time.monotonic() < end and len(got) < len(want):
        pages = requests.get(f"{state.urls.pager}/api/pages", params={"status": "firing", "limit": 1000},
                             timeout=10).json()["pages"]
        for p in pages:
            for a in p["alerts"]:
                key = (a["labels"].get("alertname"), a["labels"].get("node"))
                if key in want and f"{key[0]} {key[1]}" not in got:
                    got[f"{key[0]} {key[1]}"] = p["received_at"]
        time.sleep(0.5)
    out = {}
    for key, at in got.items():
        node = key.split(" ", 1)[1]
        scraped = first_scrape_after(scrapers, node, injected[node])
        out[key] = {"total": at - injected[node], "scrape": None if scraped is None else scraped - injected[node],
                    "after_scrape": None if scraped is None else at - scraped}
    return out


def bench_rule(run: Path) -> None:
    """Write vmalert's bench rule BenchXidViaVmalert (GpuXidCritical's expression) next to its rules."""
    shard = yaml.safe_load((run / "prometheus" / "rules-shard" / "gpu-xid.yml").read_text())
    rule = next(r for g in shard["groups"] for r in g["rules"] if r.get("alert") == "GpuXidCritical")
    # Its own Alertmanager group: with GpuXidCritical's labels it would join that alert's (node, gpu)
    # group (the xid route) and, arriving after the group's first flush, wait a group_interval (10 s)
    # for the next one; measured so before (bench/README.md). family "bench" leaves the xid route, so
    # it is grouped by alertname and node and pays its own group_wait like the shard's alert.
    bench = {**rule, "alert": "BenchXidViaVmalert", "labels": {**(rule.get("labels") or {}), "family": "bench"}}
    doc = {"groups": [{"name": "bench-xid", "rules": [bench]}]}
    # The same query parameters as every fleet-wide group of the stack (gpuobs.stack.ha.fresh_queries).
    (run / "vmalert" / "rules" / "bench-xid.yml").write_text(ha.fresh_queries(yaml.safe_dump(doc, sort_keys=False)))


def set_single_interval(state, interval_s: int) -> None:
    path = Path(state.run_dir) / "prometheus" / "prometheus.yml"
    doc = yaml.safe_load(path.read_text())
    doc["global"].update({"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s",
                          "scrape_timeout": f"{max(1, int(interval_s * 0.8))}s"})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for pid in supervisor.find_processes(state, "prometheus"):
        os.kill(pid, signal.SIGHUP)


def stack_config(run: Path, args, ports: Ports) -> supervisor.StackConfig:
    return supervisor.StackConfig(run_dir=run, nodes=args.nodes, gpus=args.gpus,
                                  training_nodes=args.nodes // args.training_every, ports=ports, logwatch=False,
                                  profile="drill", exporter_profile="recommended", timeout_s=args.start_timeout)


def phase(kind: str, args) -> dict:
    n = args.nodes
    base = free_port_range(2 * n + 64, start=12000)
    ports = Ports(prometheus=base, alertmanager=base + 1, pager=base + 2, grafana=base + 3,
                  node_base=base + 64, engine_base=base + 64 + n)
    with tempfile.TemporaryDirectory(prefix=f"bench-scale-{kind}-") as tmp:
        run = Path(tmp)
        log = io.StringIO()
        t0 = time.monotonic()
        try:
            if kind == "ha":
                state = ha.up(ha.HAConfig(stack=stack_config(run, args, ports), shards=args.shards,
                                          base_port=base + 8, scrape_interval_s=args.interval), out=log)
                bench_rule(run)
                for pid in supervisor.find_processes(state, "vmalert"):
                    os.kill(pid, signal.SIGHUP)
                urls = {k: v for k, v in state.members.items() if k.startswith("prometheus-") or k == "victoria-metrics"}
                canary_url = state.urls.prometheus
                alertnames = ["GpuXidCritical", "BenchXidViaVmalert"]
            else:
                state = supervisor.up(stack_config(run, args, ports), out=log)
                set_single_interval(state, args.interval)
                urls = {"prometheus": state.urls.prometheus}
                canary_url = state.urls.prometheus
                alertnames = ["GpuXidCritical"]
            started_s = time.monotonic() - t0
            print(f"[{kind}] up in {started_s:.0f}s; warm-up {args.warmup}s", file=sys.stderr, flush=True)
            time.sleep(args.warmup)
            m = measure(state, urls, args.window)
            print(f"[{kind}] measured; canary looks", file=sys.stderr, flush=True)
            m["canary"] = canary_looks(canary_url, args.looks, state.serving_hosts)
            if kind == "ha":
                # Same data, same moment: the look over one shard's serving nodes, through VictoriaMetrics
                # (MetricsQL) and through that shard's replica (PromQL).
                shard_hosts = [h for h in state.serving_hosts if h in shard_nodes(state, "prometheus-s0-r0")]
                at = time.time() - 30  # every replica's samples of the window have reached VictoriaMetrics
                m["canary_same_data"] = {
                    "hosts": len(shard_hosts),
                    "victoria-metrics": canary_looks(state.urls.prometheus, 1, shard_hosts, at),
                    "prometheus-s0-r0": canary_looks(state.members["prometheus-s0-r0"], 1, shard_hosts, at)}
            print(f"[{kind}] canary {m['canary']['median_s']:.2f}s; Xid", file=sys.stderr, flush=True)
            scrapers = [u for k, u in state.members.items() if k.startswith("prometheus-")] if kind == "ha" \
                else [state.urls.prometheus]
            m["xid"] = xid_latency(state, list(range(args.xid_nodes)), alertnames, scrapers)
            m["start_s"] = started_s
            return m
        except Exception:
            print(log.getvalue()[-3000:], file=sys.stderr)
            raise
        finally:
            supervisor.down(run, out=io.StringIO())


def report(args, res: dict) -> str:
    gpus = args.nodes * args.gpus
    out = [f"Fleet: {args.nodes} nodes x {args.gpus} GPUs = {gpus} GPUs ({args.nodes // args.training_every} training), "
           f"interval {args.interval}s, HA {args.shards} shards x 2 replicas + 3 Alertmanagers + VictoriaMetrics + vmalert.",
           "", "| member | samples/s ingested | head series | per GPU: series | CPU cores | RSS MiB |", "|---|---:|---:|---:|---:|---:|"]
    for kind in ("ha", "single"):
        if kind not in res:
            continue
        m = res[kind]
        for name, row in m["members"].items():
            u = m["usage"].get(name, {})
            out.append(f"| {kind}: {name} | {row.get('samples_per_s', 0):,.0f} | {row.get('head_series', 0):,.0f} | "
                       f"{row.get('head_series', 0) / gpus:.1f} | {u.get('cpu_cores', 0):.2f} | {u.get('rss_mib', 0):.0f} |")
        for name, u in m["usage"].items():
            if name not in m["members"]:
                out.append(f"| {kind}: {name} | | | | {u['cpu_cores']:.2f} | {u['rss_mib']:.0f} |")
        total = sum(u["cpu_cores"] for u in m["usage"].values())
        rss = sum(u["rss_mib"] for u in m["usage"].values())
        out.append(f"| **{kind}: all processes** | | | | **{total:.2f}** | **{rss:.0f}** |")
    out += ["", "| | HA | single | HA / single |", "|---|---:|---:|---:|"]
    if "ha" in res and "single" in res:
        h, s = res["ha"], res["single"]
        vm = h["members"].get("victoria-metrics", {})
        one = next(v for k, v in h["members"].items() if k.startswith("prometheus-"))
        sp = s["members"]["prometheus"]
        rows = [("samples/s, one Prometheus replica vs the single Prometheus", one["samples_per_s"], sp["samples_per_s"]),
                ("samples/s into the global store (VM, before dedup) vs single", vm.get("samples_per_s", 0), sp["samples_per_s"]),
                ("head series, one shard replica vs single", one["head_series"], sp["head_series"]),
                ("canary full look, median s (VM vs single Prometheus)", h["canary"]["median_s"], s["canary"]["median_s"]),
                ("CPU cores, all processes", sum(u["cpu_cores"] for u in h["usage"].values()),
                 sum(u["cpu_cores"] for u in s["usage"].values())),
                ("RSS MiB, all processes", sum(u["rss_mib"] for u in h["usage"].values()),
                 sum(u["rss_mib"] for u in s["usage"].values()))]
        for what, a, b in rows:
            out.append(f"| {what} | {a:,.2f} | {b:,.2f} | {a / b if b else float('nan'):.2f} |")
        out.append(f"| canary verdict (VM / single) | {h['canary']['verdict']} | {s['canary']['verdict']} | |")
        out += ["", "Canary look, the median look's HTTP query time (the rest of the look is decoding and statistics):",
                "", "| queries | VM: n | VM: s | single: n | single: s |", "|---|---:|---:|---:|---:|"]
        hq, sq = h["canary"].get("query_s_by_kind", {}), s["canary"].get("query_s_by_kind", {})
        for kind in sorted(set(hq) | set(sq)):
            a_, b_ = hq.get(kind, {}), sq.get(kind, {})
            out.append(f"| {kind} | {a_.get('n', 0)} | {a_.get('s', 0):.3f} | {b_.get('n', 0)} | {b_.get('s', 0):.3f} |")
        out.append(f"| **all** (of a {h['canary']['median_s']:.2f} s / {s['canary']['median_s']:.2f} s look) | "
                   f"{h['canary'].get('queries', 0)} | {h['canary'].get('query_s', 0):.3f} | "
                   f"{s['canary'].get('queries', 0)} | {s['canary'].get('query_s', 0):.3f} |")
        out += ["", f"Sizing (single Prometheus, this fleet): {sp['head_series'] / gpus:.1f} head series and "
                f"{sp['samples_per_s'] / gpus:.2f} samples/s per GPU at a {args.interval}s interval. VictoriaMetrics "
                f"received {vm.get('samples_per_s', 0) / gpus:.2f} samples/s per GPU (both replicas) and dropped "
                f"{vm.get('dedup_per_s', 0) / gpus:.2f}/s per GPU as replica duplicates in background merges "
                f"(vm_deduplicated_samples_total) during the window."]
    same = res.get("ha", {}).get("canary_same_data")
    if same:
        a_, b_ = same["victoria-metrics"], same["prometheus-s0-r0"]
        out += ["", f"Canary look on the same data ({same['hosts']} serving nodes of shard 0, same 5 min window): "
                f"VictoriaMetrics {a_['verdict']} vs shard replica {b_['verdict']}.", "",
                "| metric | VM class | VM effect | VM n canary | Prometheus class | Prometheus effect | Prometheus n canary |",
                "|---|---|---:|---:|---|---:|---:|"]
        for name, ma in a_["metrics"].items():
            mb = b_["metrics"].get(name, {})
            fmt = lambda v: "" if v is None else f"{v:.4g}"  # noqa: E731
            out.append(f"| {name} | {ma['class']} | {fmt(ma['effect'])} | {fmt(ma['n_canary'])} | {mb.get('class')} | "
                       f"{fmt(mb.get('effect'))} | {fmt(mb.get('n_canary'))} |")
    out += xid_report(args, res)
    return "\n".join(out)


def xid_paths(res: dict) -> dict[str, list[dict]]:
    """Path -> the per-fault latency rows of :func:`xid_latency` (single Prometheus, HA shard, HA vmalert)."""
    paths: dict[str, list[dict]] = {"single Prometheus": [], "HA: shard": [], "HA: vmalert over VM": []}
    for kind in ("single", "ha"):
        for key, row in res.get(kind, {}).get("xid", {}).items():
            path = "single Prometheus" if kind == "single" else (
                "HA: vmalert over VM" if key.startswith("Bench") else "HA: shard")
            paths[path].append(row)
    return paths


def xid_report(args, res: dict) -> list[str]:
    """The fault-to-page table: per path the median of the faults (total, scrape wait, after the scrape),
    the ratio to the single stack, and the bound from the settings (docs/ha.md, "Fault-to-page")."""
    i, gw = args.interval, 5.0  # alertmanager/alertmanager.yml group_wait
    rw = ha.REMOTE_WRITE_DEADLINE_S + 1.0  # batch deadline + VictoriaMetrics's raw-rows flush (1 s)
    bound = {"single Prometheus": (2 * i + gw, i + gw), "HA: shard": (2 * i + gw, i + gw),
             "HA: vmalert over VM": (2 * i + rw + gw, i + rw + gw)}
    paths = xid_paths(res)
    med = {p: {k: statistics.median([r[k] for r in rows if r[k] is not None]) if any(r[k] is not None for r in rows)
               else float("nan") for k in ("total", "scrape", "after_scrape")} for p, rows in paths.items() if rows}
    single = med.get("single Prometheus", {})
    out = ["", f"Xid 48 fault-to-page (median of {args.xid_nodes} faults per path; the scrape wait is the fault's "
           f"random phase against the {i} s scrape, the rest is the pipeline after it):", "",
           "| path | faults | total, s | scrape wait, s | after the scrape, s | total / single | after scrape / single "
           "| bound: worst / mean, s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p, m in med.items():
        ratio = lambda k: m[k] / single[k] if single.get(k) else float("nan")  # noqa: E731
        out.append(f"| {p} | {len(paths[p])} | {m['total']:.1f} | {m['scrape']:.1f} | {m['after_scrape']:.1f} | "
                   f"{ratio('total'):.2f} | {ratio('after_scrape'):.2f} | {bound[p][0]:.0f} / {bound[p][1]:.0f} |")
    out += ["", "| fault | path | total, s | scrape wait, s | after the scrape, s |", "|---|---|---:|---:|---:|"]
    for kind in ("ha", "single"):
        for key, r in sorted(res.get(kind, {}).get("xid", {}).items()):
            fmt = lambda v: "" if v is None else f"{v:.1f}"  # noqa: E731
            out.append(f"| {kind}: {key} | {'vmalert' if key.startswith('Bench') else kind} | {r['total']:.1f} | "
                       f"{fmt(r['scrape'])} | {fmt(r['after_scrape'])} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--training-every", type=int, default=8, help="one node in N runs training")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--interval", type=int, default=15)
    ap.add_argument("--warmup", type=float, default=45)
    ap.add_argument("--window", type=float, default=60)
    ap.add_argument("--looks", type=int, default=3)
    ap.add_argument("--xid-nodes", type=int, default=8, help="faults per path (one Xid per node, at once)")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--phases", default="ha,single")
    ap.add_argument("--json", help="also write the raw numbers here")
    args = ap.parse_args()
    res = {}
    for kind in args.phases.split(","):
        res[kind] = phase(kind, args)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    print(report(args, res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
