"""Rule placement for the HA topology: which rules a Prometheus shard can evaluate and which need the
global view (vmalert over VictoriaMetrics), decided from the rules' PromQL syntax trees.

A shard scrapes whole nodes (every target of a node lands on the same shard: the hashmod key is the
fleet config's identity label, ``node`` by default, see :mod:`gpuobs.stack.ha`), so an expression is
**node-local** when every aggregation and every vector match in it keeps an identity label (that one, or
``instance`` for the series of one target that has none): its result for one node needs only that node's series.
It is **fleet-wide** when some aggregation or vector match drops all identity labels (``sum by
(model_name)``, ``count by (modelName)``, ``sum without (node)``, ``sum(x)``, ``on (training_job)``,
``ignoring (node)``), because then one output series mixes nodes that live on different shards, and a
shard would see only its part of the fleet (a driver-skew count of 1 per shard while the fleet runs 2).
A rule that reads a series recorded by a fleet-wide rule is fleet-wide too (its input exists only in
the global store), computed to a fixed point.

Shapes: :func:`classify` takes one PromQL string and returns a :class:`Verdict`; :func:`place` takes
``{file name: rule file text}`` (Prometheus rule-file YAML) and returns a :class:`Placement` with the
per-rule verdicts and two rule-file sets of the same shape, ``shard`` and ``fleet``, each keeping the
groups' names, ``interval`` and rule order (a group split in two keeps its name in both halves); the
fleet rules' counter functions are rewritten by :func:`for_metricsql`. A group with no rules left is
dropped. Raises :class:`PlacementError` for YAML or PromQL that does not
parse, naming the file, group and rule.

The parser is promql-parser (GreptimeTeam's Rust PromQL parser, the Python binding), not a
hand-written one. Functions without a grouping (``absent``, ``scalar``, ``vector``) are left
node-local: the rules use none of them across nodes (checked by the tests on the shipped files).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import promql_parser as pp
import yaml

from gpuobs.core.durations import parse_duration
from gpuobs.promapi.prometheus import AT_TIME_PARAMS

#: Besides the fleet config's identity label (the node, which file_sd and ServiceMonitor targets both
#: carry, docs/real-fleet.md step 3), the label that identifies where a series comes from: the scrape target itself.
TARGET_LABEL = "instance"

SHARD = "shard"
FLEET = "fleet"


class PlacementError(ValueError):
    """A rule file or expression could not be read; the message names the file, group and rule."""


@dataclass(frozen=True)
class Verdict:
    """Where one expression must run: ``placement`` is ``shard`` or ``fleet``; ``reason`` names the
    aggregation or vector match that drops the identity labels (empty for ``shard``); ``reads`` are the
    metric names its selectors read (``__name__`` equality only)."""

    placement: str
    reason: str
    reads: frozenset[str]


@dataclass
class RuleVerdict:
    """One rule's placement: file, group, ``record`` or ``alert`` name, and the Verdict's fields."""

    file: str
    group: str
    name: str
    kind: str
    placement: str
    reason: str


@dataclass
class Placement:
    """Rule files split by placement: ``shard`` and ``fleet`` map file name -> YAML text."""

    rules: list[RuleVerdict] = field(default_factory=list)
    shard: dict[str, str] = field(default_factory=dict)
    fleet: dict[str, str] = field(default_factory=dict)

    def names(self, placement: str) -> list[str]:
        """The rule names (record or alert) placed in ``placement``, in file order, duplicates kept."""
        return [r.name for r in self.rules if r.placement == placement]


def _keeps_identity(kind: str, labels: list[str], ids: frozenset[str]) -> bool:
    """Whether a ``by``/``on`` (``kind`` include) or ``without``/``ignoring`` (exclude) list keeps one of
    the identity labels ``ids`` in the result."""
    if kind == "include":
        return bool(ids & set(labels))
    return not ids <= set(labels)  # without/ignoring keeps every label it does not name


def _walk(node, found: list[str], reads: set[str], ids: frozenset[str]) -> None:
    """Collect into ``found`` a description of each construct that drops the identity labels ``ids``, and
    into ``reads`` the metric names selected."""
    if isinstance(node, pp.VectorSelector):
        if node.name:
            reads.add(node.name)
        for m in node.matchers.matchers:
            if m.name == "__name__" and m.op == pp.MatchOp.Equal:
                reads.add(m.value)
        return
    if isinstance(node, pp.MatrixSelector):
        _walk(node.vector_selector, found, reads, ids)
        return
    if isinstance(node, pp.AggregateExpr):
        mod = node.modifier
        op = str(node.op)
        if mod is None:
            found.append(f"{op}(...) without by/without aggregates every series")
        else:
            kind = "include" if mod.type == pp.AggModifierType.By else "exclude"
            if not _keeps_identity(kind, list(mod.labels), ids):
                word = "by" if kind == "include" else "without"
                found.append(f"{op} {word} ({', '.join(mod.labels)}) drops {'/'.join(sorted(ids))}")
        _walk(node.expr, found, reads, ids)
        if node.param is not None:
            _walk(node.param, found, reads, ids)
        return
    if isinstance(node, pp.BinaryExpr):
        mod = node.modifier
        matching = getattr(mod, "matching", None) if mod is not None else None
        scalar_side = isinstance(node.lhs, pp.NumberLiteral) or isinstance(node.rhs, pp.NumberLiteral)
        if matching is not None and not scalar_side:
            kind = "include" if matching.type == pp.LabelModifierType.Include else "exclude"
            if not _keeps_identity(kind, list(matching.labels), ids):
                word = "on" if kind == "include" else "ignoring"
                found.append(f"vector match {word} ({', '.join(matching.labels)}) joins series of different nodes")
        _walk(node.lhs, found, reads, ids)
        _walk(node.rhs, found, reads, ids)
        return
    if isinstance(node, pp.Call):
        for arg in node.args:
            _walk(arg, found, reads, ids)
        return
    if isinstance(node, (pp.ParenExpr, pp.UnaryExpr, pp.SubqueryExpr)):
        _walk(node.expr, found, reads, ids)
        return
    # NumberLiteral, StringLiteral: nothing to look at.


def classify(expr: str, identity_label: str) -> Verdict:
    """Placement of one PromQL expression (see the module docstring) on a fleet whose identity label is
    ``identity_label`` (the fleet config's). Raises PlacementError if it does not parse."""
    try:
        tree = pp.parse(expr)
    except Exception as exc:  # the binding raises ValueError/RuntimeError variants
        raise PlacementError(f"PromQL does not parse: {exc}") from None
    found: list[str] = []
    reads: set[str] = set()
    _walk(tree, found, reads, frozenset({identity_label, TARGET_LABEL}))
    return Verdict(FLEET if found else SHARD, "; ".join(found), frozenset(reads))


_COUNTER_FN = re.compile(r"\b(?P<fn>rate|increase)\((?P<sel>[^()\[\]]*)\[(?P<w>[0-9][0-9a-z]*)\]\)")


def for_metricsql(expr: str) -> str:
    """A fleet-wide rule's PromQL with its counter functions made to count as PromQL does on
    VictoriaMetrics: ``increase(x[w])`` -> ``increase_prometheus(x[w])`` and ``rate(x[w])`` ->
    ``(increase_prometheus(x[w]) / <w in seconds>)``.

    Why: MetricsQL's ``increase``/``rate`` count a series whose first sample lies inside the window
    from zero when that sample is small (VictoriaMetrics v1.79.5 app/vmselect/promql/rollup.go,
    rollupDelta), and each ``le`` bucket or error counter decides that on its own. A new series (a
    relabelled node in a rollout, a replaced pod, a stack just started) then adds its whole history to
    the window: measured on the HA stack, vmalert's SLO burn rules counted a relabelled node's errors
    twice and raised false TTFT burn tickets in `make drills-ha`. ``increase_prometheus`` (MetricsQL
    extension, same file) starts at the window's first sample like PromQL and does not extrapolate, so
    a rate is low by at most one scrape interval over ``w`` (1.7 % at 5 s over 5m), equally in an SLO
    ratio's numerator and denominator. Other functions (``irate``, subqueries) are left as written."""
    def sub(m: re.Match) -> str:
        inner = f"increase_prometheus({m['sel']}[{m['w']}])"
        if m["fn"] == "increase":
            return inner
        return f"({inner} / {parse_duration(m['w'], 'range'):g})"
    return _COUNTER_FN.sub(sub, expr)


def place(files: dict[str, str], identity_label: str) -> Placement:
    """Split rule files into shard and fleet rule files (see the module docstring); ``identity_label``:
    the fleet config's, the label the shards are split by."""
    docs: dict[str, dict] = {}
    verdicts: dict[tuple[str, int, int], Verdict] = {}
    out = Placement()
    for fname, text in files.items():
        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise PlacementError(f"{fname}: not YAML: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("groups", []), list):
            raise PlacementError(f"{fname}: groups: must be a list of rule groups")
        docs[fname] = doc
        for gi, group in enumerate(doc.get("groups", [])):
            for ri, rule in enumerate(group.get("rules", [])):
                name = rule.get("record") or rule.get("alert") or f"rule {ri}"
                try:
                    verdicts[(fname, gi, ri)] = classify(str(rule.get("expr", "")), identity_label)
                except PlacementError as exc:
                    raise PlacementError(f"{fname}: group {group.get('name')!r}: {name}: {exc}") from None
    # Fixed point: a rule reading a series that only a fleet-wide rule records is fleet-wide.
    changed = True
    while changed:
        changed = False
        fleet_records = {docs[f]["groups"][g]["rules"][r].get("record") for (f, g, r), v in verdicts.items()
                         if v.placement == FLEET} - {None}
        for key, v in verdicts.items():
            if v.placement == SHARD and v.reads & fleet_records:
                dep = ", ".join(sorted(v.reads & fleet_records))
                verdicts[key] = Verdict(FLEET, f"reads {dep}, recorded by a fleet-wide rule", v.reads)
                changed = True
    # A rule that reads no series at all (a constant such as the SLO objective) joins the fleet half of
    # its group when the group has one, so all of a group's outputs come from one evaluator; alone
    # (the Watchdog), it stays on the shards: every shard then proves its own evaluation loop.
    for (f, g, r), v in list(verdicts.items()):
        if v.placement == SHARD and not v.reads and any(
                verdicts[(f2, g2, r2)].placement == FLEET for (f2, g2, r2) in verdicts if (f2, g2) == (f, g)):
            verdicts[(f, g, r)] = Verdict(FLEET, "reads no series; its group is fleet-wide", v.reads)
    for fname, doc in docs.items():
        halves: dict[str, list] = {SHARD: [], FLEET: []}
        for gi, group in enumerate(doc.get("groups", [])):
            parts: dict[str, list] = {SHARD: [], FLEET: []}
            for ri, rule in enumerate(group.get("rules", [])):
                v = verdicts[(fname, gi, ri)]
                if v.placement == FLEET and "expr" in rule:
                    rule = {**rule, "expr": for_metricsql(str(rule["expr"]))}
                parts[v.placement].append(rule)
                out.rules.append(RuleVerdict(fname, str(group.get("name")), rule.get("record") or rule.get("alert"),
                                             "record" if "record" in rule else "alert", v.placement, v.reason))
            for where, rules in parts.items():
                if rules:
                    halves[where].append({**{k: val for k, val in group.items() if k != "rules"}, "rules": rules})
        for where, groups in halves.items():
            if groups:
                text = f"# Placed on the {'Prometheus shards' if where == SHARD else 'fleet evaluator (vmalert)'} by gpuobs.mixin.placement.\n"
                (out.shard if where == SHARD else out.fleet)[fname] = text + yaml.safe_dump(
                    {"groups": groups}, sort_keys=False, width=120)
    return out


#: Prometheus ``remote_write`` ``queue_config.batch_send_deadline``, seconds: the longest a sample waits
#: in a replica's queue for its batch to fill (Prometheus v2.42.0 ``storage/remote/queue_manager.go``
#: ``runShard``: a batch is sent when it holds ``max_samples_per_send`` samples or when the deadline
#: timer fires; upstream default 5 s). It is part of every fleet-wide alert's latency (docs/ha.md,
#: "Fault-to-page"); at a large fleet batches fill in milliseconds anyway, at a small one this is at
#: most a few requests per second per replica.
REMOTE_WRITE_DEADLINE_S = 1.0


def vm_latency_offset_s(interval_s: float) -> float:
    """VictoriaMetrics's ``-search.latencyOffset`` in seconds for a scrape interval of ``interval_s``
    (both topologies, native and Kubernetes): one interval plus :data:`REMOTE_WRITE_DEADLINE_S`, the
    longest a sample takes to arrive (the 1.79 default is 30 s, its ``-help``). A query near "now"
    without ``nocache=1`` is answered this much earlier, so a range query's last point is complete."""
    return float(interval_s) + REMOTE_WRITE_DEADLINE_S
#: Query parameters vmalert adds to every rule query (``params`` of each vmalert group, vmalert v1.79.5
#: ``app/vmalert/config/config.go`` ``Group.Params``, applied by ``datasource/vm.go`` ``ApplyParams``):
#: :data:`gpuobs.promapi.prometheus.AT_TIME_PARAMS` (``nocache=1``), so VictoriaMetrics answers an instant
#: query at the time asked instead of moving it back by ``-search.latencyOffset``. The offset
#: (:func:`vm_latency_offset_s`) guards human range queries against an incomplete last point; a rule evaluated at "now" reads
#: each series' newest sample that has arrived, as a Prometheus rule does while other targets are still
#: being scraped. No cache is lost: vmalert's 5 m step almost never divides an evaluation time.
VMALERT_QUERY_PARAMS = {k: [v] for k, v in AT_TIME_PARAMS.items()}


def fresh_queries(rule_file_text: str) -> str:
    """``rule_file_text`` (a vmalert rule file, YAML) with :data:`VMALERT_QUERY_PARAMS` set on every group."""
    doc = yaml.safe_load(rule_file_text) or {}
    for g in doc.get("groups") or []:
        g["params"] = {**(g.get("params") or {}), **VMALERT_QUERY_PARAMS}
    return yaml.safe_dump(doc, sort_keys=False)


#: Job name under which every Prometheus replica of the HA topology scrapes VictoriaMetrics and vmalert
#: (no sharding: each shard must notice for itself that the global view is gone). The native topology
#: (gpuobs.stack.ha) and the Kubernetes one (gpuobs.mixin.kubernetes, deploy/kubernetes/ha) both use it.
GLOBAL_JOB = "ha-global"


def blind_rule(runbook_base: str) -> str:
    """Rule file (YAML text) of ``FleetRulesBlind``, evaluated on every shard: VictoriaMetrics or
    vmalert is down (``up == 0``), or a vmalert rule's last evaluation failed (vmalert 1.79's
    ``vmalert_alerting_rules_error`` / ``vmalert_recording_rules_error`` gauges are 1, e.g. while
    VictoriaMetrics does not answer), so the fleet-wide rules cannot fire. A ticket (severity warning), not a page: the
    node-local pages, on the shards, still arrive. Node-local by :mod:`gpuobs.mixin.placement`
    (every aggregation keeps ``instance``)."""
    doc = {"groups": [{"name": "ha-topology", "rules": [{
        "alert": "FleetRulesBlind",
        "expr": (f'up{{job="{GLOBAL_JOB}"}} == 0 or max by (job, instance) ('
                 f'vmalert_alerting_rules_error{{job="{GLOBAL_JOB}"}} '
                 f'or vmalert_recording_rules_error{{job="{GLOBAL_JOB}"}}) > 0'),
        "for": "20s",
        "labels": {"severity": "warning", "family": "ha"},
        "annotations": {
            "summary": "The fleet-wide rules are blind: VictoriaMetrics or vmalert is down or failing.",
            "description": "{{ $labels.instance }} ({{ $labels.job }}) is down or vmalert's rules fail: driver skew, "
                           "SLO burn and training-straggler alerts cannot fire until it is back. Node-local pages "
                           "(Xid, ECC, exporter down) still come from the Prometheus shards.",
            "runbook_url": f"{runbook_base.rstrip('/')}/runbooks/ha.md#fleetrulesblind"}}]}]}
    return "# The HA topology's own alert (gpuobs.stack.ha.blind_rule).\n" + yaml.safe_dump(doc, sort_keys=False)
