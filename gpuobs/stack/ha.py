"""The HA topology: ``gpuobs stack up --topology ha`` (docs/ha.md).

On 127.0.0.1, next to the same simulated fleet and pager as the single stack
(:func:`gpuobs.stack.supervisor.fleet_parts`):

* ``S`` Prometheus shards x ``R`` replicas (``prometheus-s<i>-r<j>``). Every replica of a shard has the
  same config but its ``external_labels`` (``shard``, ``replica``). A shard keeps the targets whose
  ``hashmod`` of the shard key is its index; the key is the target's ``node`` label (so the DCGM,
  vLLM and logwatch targets of one node land on one shard, and the node-local rules that join them
  see all of a node's series), or ``__address__`` for a target without one.
* An Alertmanager cluster of ``M`` members (``alertmanager-<i>``, gossip on loopback ports; every
  member lists the others as ``--cluster.peer``). Every Prometheus and vmalert sends to every member;
  the cluster's notification log dedupes the replicas' copies (Alertmanager docs, "High
  Availability": "It's important not to load balance traffic between Prometheus and its Alertmanagers,
  but instead, point Prometheus to a list of all Alertmanagers").
* VictoriaMetrics single-node (``victoria-metrics``) as the global store: every replica
  ``remote_write``\\ s to it with the ``replica`` and ``shard`` external labels dropped
  (``write_relabel_configs``), so the two replicas of a shard write identical series, which
  VictoriaMetrics deduplicates with ``-dedup.minScrapeInterval`` equal to the scrape interval
  (VictoriaMetrics 1.79 docs, "Deduplication": "If duplicate data is pushed to VictoriaMetrics from
  identically configured vmagent instances or Prometheus instances, then the
  -dedup.minScrapeInterval must be set to scrape_interval from scrape configs"; "identically
  configured" means without a label that differs between replicas). The same two labels are dropped
  from the alerts a replica sends (``alert_relabel_configs``), so both replicas' copies of an alert
  have one fingerprint in Alertmanager.
* ``vmalert`` evaluating the fleet-wide rules (:mod:`gpuobs.mixin.placement`) against
  VictoriaMetrics, notifying every Alertmanager member, writing its recording results and ``ALERTS``
  back to VictoriaMetrics (``-remoteWrite.url``) and restoring alert state from it after a restart
  (``-remoteRead.url``). The shards evaluate the node-local rules.

``urls.prometheus`` of the recorded state is VictoriaMetrics's Prometheus API (the global view: the
canary, doctor and reports take any Prometheus-API URL); ``urls.alertmanager`` is the first member.
``down`` and ``status`` are the supervisor's (every member is a recorded component with its own port).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests
import yaml

from gpuobs.core.durations import format_duration
from gpuobs.core.files import atomic_write
from gpuobs.core.fleet import shipped_fleet
from gpuobs.mixin.placement import (
    GLOBAL_JOB,
    REMOTE_WRITE_DEADLINE_S,
    vm_latency_offset_s,
    blind_rule,
    fresh_queries,
    place,
)
from gpuobs.mixin.profile import profile_rules
from gpuobs.stack import alert_timing
from gpuobs.stack.ports import free_port_range
from gpuobs.stack.render import render_alertmanager, render_prometheus, scrape_pools
from gpuobs.stack.state import StackState, StackUrls
from gpuobs.stack.supervisor import (
    StackConfig,
    StackError,
    _make_private,
    _ok,
    _wait,
    check_config,
    check_ports,
    down,
    drop_notification_log,
    find_binaries,
    fleet_parts,
    host_models,
    load_state,
    private_files,
    start_components,
)

VM_HINT = ("install it with: apt-get install -y --no-install-recommends victoria-metrics (Debian/Ubuntu, as root; "
           "`make binaries` does it), or put the upstream victoria-metrics and vmalert binaries on PATH")
#: The labels naming a replica's place in the topology; dropped before VictoriaMetrics and Alertmanager.
TOPOLOGY_LABELS = ("shard", "replica")


@dataclass
class HAConfig:
    """The HA topology's shape on top of a :class:`~gpuobs.stack.supervisor.StackConfig` (fleet, pager
    port, profile, run directory): ``shards`` x ``replicas`` Prometheus servers, ``alertmanagers``
    cluster members, and ``base_port``, the first of the block of loopback ports its members take
    (0: a free block is chosen). ``scrape_interval_s``: every replica's scrape and evaluation
    interval, vmalert's evaluation interval and VictoriaMetrics's dedup interval."""

    stack: StackConfig = field(default_factory=StackConfig)
    shards: int = 2
    replicas: int = 2
    alertmanagers: int = 3
    base_port: int = 0
    scrape_interval_s: float = 5.0
    #: Alertmanager ``--cluster.peer-timeout``: how long the member at position p waits (p x this)
    #: before it checks the shared notification log and notifies. Upstream's 15 s is sized for a
    #: network; on loopback gossip lands in milliseconds, and a long wait is what lets a waiting member
    #: send a notification made from a stale snapshot (an alert that another member already notified
    #: as resolved), see docs/ha.md.
    peer_timeout_s: float = 3.0

    def port_count(self) -> int:
        """Ports the members take: one per Prometheus, two per Alertmanager (web, gossip), VM, vmalert."""
        return self.shards * self.replicas + 2 * self.alertmanagers + 2


def prometheus_name(shard: int, replica: int) -> str:
    """Component name of a Prometheus replica, ``prometheus-s<shard>-r<replica>``."""
    return f"prometheus-s{shard}-r{replica}"


def find_ha_binaries() -> dict[str, str]:
    """prometheus, Alertmanager, victoria-metrics and vmalert paths; StackError (exit 2) naming what is missing."""
    found = find_binaries()
    extra = {"victoria-metrics": shutil.which("victoria-metrics") or shutil.which("victoria-metrics-prod"),
             "vmalert": shutil.which("vmalert") or shutil.which("vmalert-prod")}
    missing = [k for k, v in extra.items() if not v]
    if missing:
        raise StackError(f"missing binaries: {', '.join(missing)}; {VM_HINT}", 2)
    return {**found, **extra}  # type: ignore[dict-item]


def assign_ports(cfg: HAConfig) -> dict[str, int]:
    """Component name -> port for every member (Alertmanager gossip as ``alertmanager-<i>-cluster``)."""
    base = cfg.base_port or free_port_range(cfg.port_count(), start=21000)
    names = [prometheus_name(s, r) for s in range(cfg.shards) for r in range(cfg.replicas)]
    names += [f"alertmanager-{i}" for i in range(cfg.alertmanagers)]
    names += [f"alertmanager-{i}-cluster" for i in range(cfg.alertmanagers)]
    names += ["victoria-metrics", "vmalert"]
    return {n: base + i for i, n in enumerate(names)}


def shard_relabel(shards: int, shard: int, identity_label: str) -> list[dict]:
    """relabel_configs that keep the targets of ``shard`` of ``shards``: shard key = the fleet config's
    ``identity_label`` or, when a target has none, ``__address__``; ``hashmod`` of it, keep the
    matching index (Prometheus docs, relabel_config ``hashmod``/``keep``). The rule placement
    (:func:`gpuobs.mixin.placement.place`) splits by the same label."""
    return [
        {"source_labels": [identity_label], "target_label": "__tmp_shard_key"},
        # "<empty node>;<address>" -> the address; a target with a node keeps its node as the key.
        {"source_labels": ["__tmp_shard_key", "__address__"], "separator": ";", "regex": ";(.+)",
         "target_label": "__tmp_shard_key", "replacement": "$1"},
        {"source_labels": ["__tmp_shard_key"], "modulus": shards, "target_label": "__tmp_shard", "action": "hashmod"},
        {"source_labels": ["__tmp_shard"], "regex": str(shard), "action": "keep"},
    ]


def replica_config(base: dict, shard: int, replica: int, cfg: HAConfig, am_targets: list[str], vm_url: str,
                   self_target: str, global_targets: list[str], rules_glob: str) -> dict:
    """One replica's Prometheus config (a dict for ``prometheus.yml``) from the single stack's ``base``
    config: the one renderer of the native topology (:func:`render_replica`, loopback addresses) and of
    the compose profile ``ha`` (:func:`render_compose_ha`, service names).

    ``base``: a parsed single-stack config (``global``, ``scrape_configs``), not modified.
    ``am_targets``: ``host:port`` of every Alertmanager member; ``vm_url``: VictoriaMetrics's base URL
    (remote write goes to ``<vm_url>/api/v1/write``); ``self_target``: ``host:port`` of this replica for
    the ``prometheus`` job; ``global_targets``: VictoriaMetrics and vmalert (job :data:`GLOBAL_JOB`, not
    sharded); ``rules_glob``: ``rule_files`` entry. Intervals: ``cfg.scrape_interval_s`` seconds for
    scrapes and evaluations, timeout 0.8 of it (at least 1 s). Every other job gets
    :func:`shard_relabel` ahead of its own ``relabel_configs``; ``shard``/``replica`` become external
    labels and are dropped from remote write and from alerts (module docstring)."""
    doc = copy.deepcopy(base)
    interval = format_duration(cfg.scrape_interval_s)
    doc["global"].update({"scrape_interval": interval, "evaluation_interval": interval,
                          "scrape_timeout": format_duration(max(1.0, cfg.scrape_interval_s * 0.8)),
                          "external_labels": {"shard": str(shard), "replica": str(replica)}})
    drop = {"regex": "|".join(TOPOLOGY_LABELS), "action": "labeldrop"}
    doc["alerting"] = {"alert_relabel_configs": [drop],
                       "alertmanagers": [{"static_configs": [{"targets": list(am_targets)}]}]}
    doc["rule_files"] = [rules_glob]
    doc["remote_write"] = [{"url": f"{vm_url}/api/v1/write", "write_relabel_configs": [drop],
                            "queue_config": {"batch_send_deadline": format_duration(REMOTE_WRITE_DEADLINE_S)}}]
    for sc in doc["scrape_configs"]:
        if sc["job_name"] == "prometheus":
            sc["static_configs"] = [{"targets": [self_target]}]
        else:
            sc["relabel_configs"] = (shard_relabel(cfg.shards, shard, shipped_fleet().identity_label)
                                     + list(sc.get("relabel_configs") or []))
    doc["scrape_configs"].append({"job_name": GLOBAL_JOB, "static_configs": [{"targets": list(global_targets)}]})
    return doc


def render_replica(run: Path, base_cfg: Path, name: str, shard: int, replica: int, cfg: HAConfig,
                   ports: dict[str, int], rules_dir: Path) -> Path:
    """Write ``run/<name>/prometheus.yml`` from the rendered single-stack config; returns its path."""
    doc = replica_config(yaml.safe_load(base_cfg.read_text()), shard, replica, cfg,
                         [f"127.0.0.1:{ports[f'alertmanager-{i}']}" for i in range(cfg.alertmanagers)],
                         f"http://127.0.0.1:{ports['victoria-metrics']}", f"127.0.0.1:{ports[name]}",
                         [f"127.0.0.1:{ports['victoria-metrics']}", f"127.0.0.1:{ports['vmalert']}"],
                         str(rules_dir / "*.yml"))
    path = run / name / "prometheus.yml"
    atomic_write(path, yaml.safe_dump(doc, sort_keys=False))
    return path


def victoria_metrics_flags(interval_s: float) -> list[str]:
    """VictoriaMetrics's dedup and freshness flags for a scrape interval of ``interval_s`` seconds
    (both topologies): ``-dedup.minScrapeInterval`` = the interval (one sample per series and interval:
    the replica pairs' copies collapse into one; VictoriaMetrics 1.79 docs, "Deduplication") and
    ``-search.latencyOffset`` = :func:`gpuobs.mixin.placement.vm_latency_offset_s` (interval + the
    remote-write batch deadline), so vmalert and the canary see fresh data."""
    return [f"-dedup.minScrapeInterval={format_duration(interval_s)}",
            f"-search.latencyOffset={format_duration(vm_latency_offset_s(interval_s))}"]


def alertmanager_cluster_flags(peers: list[str], peer_timeout_s: float) -> list[str]:
    """A member's gossip flags besides its listen/advertise address: ``--cluster.peer`` for every other
    member (``host:port``; Alertmanager v0.25.0 ``cluster/cluster.go`` ``resolvePeers`` keeps a name
    that does not resolve yet as is, ``setInitialFailed`` puts every initial peer on the failed list and
    ``reconnect`` retries it every ``--cluster.reconnect-interval``, default 10 s, so members may start
    in any order) and ``--cluster.peer-timeout`` (``peer_timeout_s`` seconds; see :class:`HAConfig`)."""
    return [*[f"--cluster.peer={p}" for p in peers], f"--cluster.peer-timeout={format_duration(peer_timeout_s)}"]


def render_rules_placed(run: Path, runbook_base: str, profile: str) -> tuple[Path, Path]:
    """Write the profile's rules split by :func:`gpuobs.mixin.placement.place`: node-local ones under
    ``run/prometheus/rules-shard``, fleet-wide ones under ``run/vmalert/rules`` (each group with
    :data:`gpuobs.mixin.placement.VMALERT_QUERY_PARAMS`, :func:`fresh_queries`); returns both folders."""
    placed = place(profile_rules(runbook_base, profile), shipped_fleet().identity_label)
    shard_dir, fleet_dir = run / "prometheus" / "rules-shard", run / "vmalert" / "rules"
    fleet_files = {fname: fresh_queries(text) for fname, text in placed.fleet.items()}
    for folder, files in ((shard_dir, placed.shard), (fleet_dir, fleet_files)):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.yml"):
            old.unlink()
        for fname, text in files.items():
            atomic_write(folder / fname, text)
    atomic_write(run / "placement.json", json.dumps([asdict(r) for r in placed.rules], indent=1))
    return shard_dir, fleet_dir




def _cluster_size(url: str) -> int:
    """Peers an Alertmanager sees in its cluster (``/api/v2/status`` ``cluster.peers``), itself included."""
    doc = requests.get(f"{url}/api/v2/status", timeout=2).json()
    return len(doc.get("cluster", {}).get("peers") or [])


def _vm_targets_up(vm_url: str, expected: int, pools: tuple[str, ...]) -> bool:
    """Whether an instant query on VictoriaMetrics finds ``expected`` ``up == 1`` series of the node
    scrape pools (one per target: the replicas' copies carry no shard/replica label)."""
    jobs = "|".join(re.escape(p) for p in pools)
    q = f'count(up{{job=~"{jobs}"}} == 1)'
    doc = requests.get(f"{vm_url}/api/v1/query", params={"query": q}, timeout=2).json()
    res = (doc.get("data") or {}).get("result") or []
    return bool(res) and int(float(res[0]["value"][1])) >= expected


def _targets_up(urls: list[str], expected: int, pools: tuple[str, ...]) -> bool:
    """Whether the shards (one replica each, ``urls``) together scrape ``expected`` node targets, all up."""
    seen = 0
    for url in urls:
        resp = requests.get(f"{url}/api/v1/targets", params={"state": "active"}, timeout=2).json()
        ts = [t for t in resp["data"]["activeTargets"] if t.get("scrapePool") in pools]
        if not all(t["health"] == "up" for t in ts):
            return False
        seen += len(ts)
    return seen == expected


def up(cfg: HAConfig, out=sys.stdout) -> StackState:
    """Start the HA topology and wait until every member is ready, every node target is up on its
    shard and every Alertmanager sees the whole cluster; returns the recorded StackState.

    Raises StackError: exit 2 for a bad shape, missing binaries, busy ports or a stack already running
    in the run directory; exit 1 when a member fails to start (everything started is stopped).
    """
    if not 1 <= cfg.shards <= 16:
        raise StackError(f"--shards must be 1..16; got {cfg.shards}", 2)
    if not 1 <= cfg.replicas <= 4:
        raise StackError(f"--replicas must be 1..4; got {cfg.replicas}", 2)
    if not 1 <= cfg.alertmanagers <= 7:
        raise StackError(f"--alertmanagers must be 1..7; got {cfg.alertmanagers}", 2)
    if not 1 <= cfg.scrape_interval_s <= 300:
        raise StackError(f"scrape interval must be 1..300 s; got {cfg.scrape_interval_s:g}", 2)
    with private_files():
        return _up(cfg, out)


def vmalert_argv(binary: str, fleet_rules: Path | str, vm_url: str, am_urls: list[str], interval_s: float, port: int,
                 timing: alert_timing.AlertTiming = alert_timing.DEFAULT, listen_host: str = "127.0.0.1",
                 external_url: str | None = None) -> list[str]:
    """vmalert's command line: the fleet-wide rules against VictoriaMetrics (query, recording results and
    ``ALERTS`` written back, ``for`` state restored from it), every Alertmanager as a notifier, and
    :meth:`~gpuobs.stack.alert_timing.AlertTiming.vmalert_flags`: ``-rule.resendDelay`` equal to
    Prometheus's resend delay, so a firing fleet-wide alert carries ``endsAt = now + 4 x resend delay``
    (vmalert v1.79.5 ``app/vmalert/group.go`` ``getResolveDuration``) and survives a vmalert outage as
    long as a shard's alert survives a Prometheus outage (docs/alert-delivery.md, docs/ha.md);
    ``-datasource.queryTimeAlignment=false`` so a rule reads the data of its evaluation time (see
    :data:`gpuobs.mixin.placement.VMALERT_QUERY_PARAMS` for the rest of the fleet-wide alerts' latency).
    ``listen_host``: ``-httpListenAddr`` host (``""``: every interface, the compose container);
    ``external_url``: ``-external.url`` (default ``http://127.0.0.1:<port>``)."""
    url = external_url or f"http://127.0.0.1:{port}"
    return [binary, f"-rule={fleet_rules}/*.yml", f"-datasource.url={vm_url}",
            f"-remoteWrite.url={vm_url}", f"-remoteRead.url={vm_url}",
            *[f"-notifier.url={u}" for u in am_urls], f"-evaluationInterval={format_duration(interval_s)}",
            # Query at the evaluation's own time. With the default (true) vmalert truncates the query time
            # to a multiple of the evaluation interval (vmalert v1.79.5 app/vmalert/datasource/
            # vm_prom_api.go setPrometheusInstantReqParams), so a group whose evaluations fall late in
            # the interval reads data up to one interval old; the alignment only makes several vmalert
            # replicas agree, and this topology runs one.
            "-datasource.queryTimeAlignment=false",
            f"-httpListenAddr={listen_host}:{port}", f"-external.url={url}", *timing.vmalert_flags(),
            "-loggerFormat=json"]


def _up(cfg: HAConfig, out) -> StackState:
    sc = cfg.stack
    run = check_config(sc)
    bins = find_ha_binaries()
    ports = assign_ports(cfg)
    p = sc.ports
    serving = sc.nodes - sc.training_nodes
    node_ports = [p.node_base + i for i in range(sc.nodes)]
    engine_ports = [p.engine_base + i for i in range(serving)]
    check_ports([p.pager, *node_ports, *engine_ports, *ports.values()],
                "--pager-port, --base-port, --engine-base-port, --ha-base-port")
    _make_private(run)
    (run / "logs").mkdir(parents=True, exist_ok=True)
    am_urls = [f"http://127.0.0.1:{ports[f'alertmanager-{i}']}" for i in range(cfg.alertmanagers)]
    vm_url = f"http://127.0.0.1:{ports['victoria-metrics']}"
    vmalert_url = f"http://127.0.0.1:{ports['vmalert']}"
    fleet = fleet_parts(sc, run, am_urls[0], vm_url)  # the pager measures impact from the global store
    timing = alert_timing.DEFAULT
    # The single stack's config (targets, scrape jobs) is the template every replica starts from.
    base_cfg = render_prometheus(run, p, fleet.nodes, fleet.engines, fleet.runbook_base, sc.profile,
                                 scrape_mode=sc.scrape_mode, pods=fleet.pods)
    shard_rules, fleet_rules = render_rules_placed(run, fleet.runbook_base, sc.profile)
    atomic_write(shard_rules / "ha-topology.yml", blind_rule(fleet.runbook_base))
    am_cfg = render_alertmanager(run, p, pager_token_file=fleet.pager_token_file,
                                 resolve_timeout=format_duration(timing.resolve_timeout_s))
    specs: dict[str, list[str]] = {"victoria-metrics": [
        bins["victoria-metrics"], f"-storageDataPath={run / 'victoria-metrics' / 'data'}",
        f"-httpListenAddr=127.0.0.1:{ports['victoria-metrics']}", "-retentionPeriod=7d",
        *victoria_metrics_flags(cfg.scrape_interval_s), "-loggerFormat=json"]}
    checks: dict = {"victoria-metrics": lambda: _ok(f"{vm_url}/health")}
    members: dict[str, str] = {"victoria-metrics": vm_url}
    for i in range(cfg.alertmanagers):
        name, cport = f"alertmanager-{i}", ports[f"alertmanager-{i}-cluster"]
        peers = alertmanager_cluster_flags([f"127.0.0.1:{ports[f'alertmanager-{j}-cluster']}"
                                            for j in range(cfg.alertmanagers) if j != i], cfg.peer_timeout_s)
        (run / name / "data").mkdir(parents=True, exist_ok=True)
        drop_notification_log(run / name / "data", out)
        specs[name] = [bins["alertmanager"], f"--config.file={am_cfg}", f"--storage.path={run / name / 'data'}",
                       f"--web.listen-address=127.0.0.1:{ports[name]}", f"--web.external-url={am_urls[i]}",
                       f"--cluster.listen-address=127.0.0.1:{cport}", f"--cluster.advertise-address=127.0.0.1:{cport}",
                       *peers,
                       "--log.format=json", *timing.alertmanager_flags()]
        checks[name] = (lambda u: lambda: _ok(f"{u}/-/ready"))(am_urls[i])
        members[name] = am_urls[i]
    prom_names = []
    for s in range(cfg.shards):
        for r in range(cfg.replicas):
            name = prometheus_name(s, r)
            url = f"http://127.0.0.1:{ports[name]}"
            conf = render_replica(run, base_cfg, name, s, r, cfg, ports, shard_rules)
            (run / name / "data").mkdir(parents=True, exist_ok=True)
            specs[name] = [bins["prometheus"], f"--config.file={conf}", f"--storage.tsdb.path={run / name / 'data'}",
                           f"--web.listen-address=127.0.0.1:{ports[name]}", "--storage.tsdb.retention.time=7d",
                           f"--web.external-url={url}", "--log.format=json", *timing.prometheus_flags()]
            checks[name] = (lambda u: lambda: _ok(f"{u}/-/ready"))(url)
            members[name] = url
            prom_names.append(name)
    specs["vmalert"] = vmalert_argv(bins["vmalert"], fleet_rules, vm_url, am_urls, cfg.scrape_interval_s,
                                    ports["vmalert"], timing)
    checks["vmalert"] = lambda: _ok(f"{vmalert_url}/health")
    members["vmalert"] = vmalert_url
    urls = StackUrls(prometheus=vm_url, alertmanager=am_urls[0], pager=fleet.pager_url, grafana=None,
                     nodes=[f"http://127.0.0.1:{port}/metrics" for port in node_ports],
                     engines=[f"http://127.0.0.1:{port}/metrics" for port in engine_ports], logwatch=fleet.lw_urls)
    state = StackState(run_dir=str(run), started_at=time.time(), ports={**asdict(p), **ports}, nodes=sc.nodes,
                       gpus=sc.gpus, seed=sc.seed, training_nodes=sc.training_nodes, profile=sc.profile,
                       exporter_profile=sc.exporter_profile, host_label_mode=sc.host_label_mode,
                       scrape_mode=sc.scrape_mode, hostnames=[h for h, _ in fleet.nodes],
                       token_file=str(run / "admin-token"), urls=urls, logwatch=sc.logwatch, topology="ha",
                       members=members, runbook_base=fleet.runbook_base, gpu_models=host_models(sc))
    # Grafana is not started here: point it at urls.prometheus (VictoriaMetrics) if wanted.
    state.ports.pop("grafana", None)
    deadline = time.monotonic() + sc.timeout_s
    own = {**{f"logwatch-{i}": u for i, u in enumerate(fleet.lw_urls)}, **members}
    try:
        start_components(state, {**fleet.specs, **specs}, {**fleet.checks, **checks}, deadline, out, urls=own)
        pools = scrape_pools(sc.scrape_mode) + (("logwatch",) if sc.logwatch else ())
        expected = sc.nodes * (2 if sc.logwatch else 1) + serving
        for r in range(cfg.replicas):
            _wait(f"replica {r} of every shard to report its node targets up",
                  lambda r=r: _targets_up([members[prometheus_name(s, r)] for s in range(cfg.shards)], expected, pools),
                  deadline)
        _wait("every Alertmanager to see the whole cluster",
              lambda: all(_cluster_size(u) == cfg.alertmanagers for u in am_urls), deadline)
        # urls.prometheus is VictoriaMetrics: whoever reads it next (the rollout's compatibility gate,
        # the canary, doctor) must find the fleet there, not only on the shards. It sees a sample after
        # remote write (up to REMOTE_WRITE_DEADLINE_S) and its -search.latencyOffset (vm_latency_offset_s).
        _wait("VictoriaMetrics to hold every node target's samples",
              lambda: _vm_targets_up(vm_url, expected, pools), deadline)
    except BaseException:
        down(sc.run_dir, out=out)
        raise
    return state


def cluster_status(run_dir: Path) -> list[dict]:
    """For each Alertmanager member of the HA stack in ``run_dir``: ``{"component", "url", "peers",
    "cluster"}`` (peers it sees, itself included, and its cluster status: ready, settling, disabled;
    ``peers`` None when it does not answer). Empty for a single stack or none."""
    state = load_state(run_dir.resolve())
    if not state or state.topology != "ha":
        return []
    rows = []
    for name, url in state.members.items():
        if not name.startswith("alertmanager-"):
            continue
        try:
            doc = requests.get(f"{url}/api/v2/status", timeout=2).json()
            cl = doc.get("cluster", {})
            rows.append({"component": name, "url": url, "peers": len(cl.get("peers") or []),
                         "cluster": cl.get("status", "")})
        except (requests.RequestException, ValueError):
            rows.append({"component": name, "url": url, "peers": None, "cluster": "unreachable"})
    return rows


# ---- the compose profile `ha` (compose/docker-compose.yml, docs/compose.md) --------------------------
#: Where the compose profile's rendered files (:func:`render_compose_ha`) are mounted, read-only, in
#: every service of the profile.
COMPOSE_HA_MOUNT = "/etc/gpuobs-ha"
#: Container ports of the profile's services (the upstream defaults; each service has its own address).
COMPOSE_PORTS = {"prometheus": 9090, "alertmanager": 9093, "alertmanager-cluster": 9094,
                 "victoria-metrics": 8428, "vmalert": 8880, "pager": 9097}
#: The shape compose/docker-compose.yml spells out: its services are fixed, so the renderer refuses another.
COMPOSE_HA = HAConfig()


def compose_ha_services(cfg: HAConfig = COMPOSE_HA) -> list[str]:
    """The profile's service names, in start order: VictoriaMetrics, the Alertmanager members, the
    Prometheus replicas (``prometheus-s<i>-r<j>``), vmalert."""
    return (["victoria-metrics"] + [f"alertmanager-{i}" for i in range(cfg.alertmanagers)]
            + [prometheus_name(s, r) for s in range(cfg.shards) for r in range(cfg.replicas)] + ["vmalert"])


def compose_ha_commands(cfg: HAConfig = COMPOSE_HA,
                        timing: alert_timing.AlertTiming = alert_timing.DEFAULT) -> dict[str, list[str]]:
    """Service -> ``command`` (the image's entry point's arguments) of every service of the compose
    profile ``ha``: the native topology's flags (:func:`victoria_metrics_flags`,
    :func:`alertmanager_cluster_flags`, :func:`vmalert_argv`, the same :mod:`~gpuobs.stack.alert_timing`)
    with service names for addresses. ``tests/stack/test_compose_ha.py`` holds the compose file to it.

    Alertmanager members listen for gossip on ``0.0.0.0:9094`` with no advertise address: Alertmanager
    v0.25.0 ``cluster/cluster.go`` ``Create`` then advertises the container's private address
    (``calculateAdvertiseAddress``: the first private IP, which a Docker bridge address is)."""
    p = COMPOSE_PORTS
    m = COMPOSE_HA_MOUNT
    vm = f"http://victoria-metrics:{p['victoria-metrics']}"
    am_urls = [f"http://alertmanager-{i}:{p['alertmanager']}" for i in range(cfg.alertmanagers)]
    cmds = {"victoria-metrics": ["-storageDataPath=/victoria-metrics", f"-httpListenAddr=:{p['victoria-metrics']}",
                                 "-retentionPeriod=7d", *victoria_metrics_flags(cfg.scrape_interval_s),
                                 "-loggerFormat=json"]}
    for i in range(cfg.alertmanagers):
        peers = [f"alertmanager-{j}:{p['alertmanager-cluster']}" for j in range(cfg.alertmanagers) if j != i]
        cmds[f"alertmanager-{i}"] = [
            f"--config.file={m}/alertmanager/alertmanager.yml", "--storage.path=/alertmanager",
            f"--web.listen-address=:{p['alertmanager']}", f"--web.external-url={am_urls[i]}",
            f"--cluster.listen-address=0.0.0.0:{p['alertmanager-cluster']}",
            *alertmanager_cluster_flags(peers, cfg.peer_timeout_s), "--log.format=json", *timing.alertmanager_flags()]
    for s in range(cfg.shards):
        for r in range(cfg.replicas):
            name = prometheus_name(s, r)
            cmds[name] = [f"--config.file={m}/prometheus/{name}.yml", "--storage.tsdb.path=/prometheus",
                          f"--web.listen-address=:{p['prometheus']}", "--storage.tsdb.retention.time=7d",
                          f"--web.external-url=http://{name}:{p['prometheus']}", "--log.format=json",
                          *timing.prometheus_flags()]
    cmds["vmalert"] = vmalert_argv("vmalert", f"{m}/vmalert/rules", vm, am_urls, cfg.scrape_interval_s,
                                   p["vmalert"], timing, listen_host="",
                                   external_url=f"http://vmalert:{p['vmalert']}")[1:]
    return cmds


def render_compose_ha(out: Path, base_config: Path, profile: str = "default", runbook_base: str = "",
                      cfg: HAConfig = COMPOSE_HA) -> dict[str, Path]:
    """Render every file the compose profile ``ha`` mounts (at :data:`COMPOSE_HA_MOUNT`) into ``out``,
    from the one fleet config, with the native topology's renderers; returns name -> path:

    * ``prometheus/prometheus-s<i>-r<j>.yml``: :func:`replica_config` of ``base_config`` (the compose
      stack's ``compose/prometheus.yml``: file_sd targets named by container, labelled ``node``), its
      ``alertmanager`` job pointed at the members;
    * ``prometheus/rules-shard/*.yml`` (node-local rules + :func:`blind_rule`) and ``vmalert/rules/*.yml``
      (fleet-wide rules): :func:`render_rules_placed` for rule ``profile`` (``default`` | ``drill``),
      and ``placement.json``;
    * ``alertmanager/alertmanager.yml``: :func:`~gpuobs.stack.render.render_alertmanager` with the
      webhooks at ``pager:9097`` (the pager runs ``--no-auth`` in compose: no token) and the HA
      ``resolve_timeout``.

    ``runbook_base``: base of the runbook links (default the pager's, :data:`gpuobs.core.fleet.RUNBOOK_BASE`).
    Raises ValueError naming the field when ``cfg`` is not the shape the compose file spells out
    (:data:`COMPOSE_HA`) or ``profile`` is unknown."""
    from gpuobs.core.fleet import RUNBOOK_BASE
    from gpuobs.stack.render import Ports

    for fld in ("shards", "replicas", "alertmanagers", "scrape_interval_s"):
        if getattr(cfg, fld) != getattr(COMPOSE_HA, fld):
            raise ValueError(f"{fld} must be {getattr(COMPOSE_HA, fld)} for the compose profile ha "
                             f"(compose/docker-compose.yml lists its services); got {getattr(cfg, fld)}")
    runbook_base = runbook_base or RUNBOOK_BASE
    p, m = COMPOSE_PORTS, COMPOSE_HA_MOUNT
    timing = alert_timing.DEFAULT
    shard_dir, fleet_dir = render_rules_placed(out, runbook_base, profile)
    atomic_write(shard_dir / "ha-topology.yml", blind_rule(runbook_base))
    base = yaml.safe_load(base_config.read_text())
    am_targets = [f"alertmanager-{i}:{p['alertmanager']}" for i in range(cfg.alertmanagers)]
    for sc in base["scrape_configs"]:
        if sc["job_name"] == "alertmanager":
            sc["static_configs"] = [{"targets": am_targets}]
    written: dict[str, Path] = {}
    for s in range(cfg.shards):
        for r in range(cfg.replicas):
            name = prometheus_name(s, r)
            doc = replica_config(base, s, r, cfg, am_targets, f"http://victoria-metrics:{p['victoria-metrics']}",
                                 f"localhost:{p['prometheus']}",
                                 [f"victoria-metrics:{p['victoria-metrics']}", f"vmalert:{p['vmalert']}"],
                                 f"{m}/prometheus/rules-shard/*.yml")
            written[name] = out / "prometheus" / f"{name}.yml"
            atomic_write(written[name], "# Rendered by gpuobs.stack.ha.render_compose_ha; do not edit.\n"
                         + yaml.safe_dump(doc, sort_keys=False))
    written["alertmanager"] = render_alertmanager(out, Ports(pager=p["pager"]), pager_token_file=None,
                                                  resolve_timeout=format_duration(timing.resolve_timeout_s),
                                                  pager_host="pager")
    written["rules-shard"], written["vmalert-rules"] = shard_dir, fleet_dir
    return written
