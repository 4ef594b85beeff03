"""Driver fleet upgrades: a rollout whose "version" on a node is its NVIDIA driver, in batches
stratified by GPU model, each GPU model judged on its own against its own history.

A driver upgrade is a rollout (:class:`gpuobs.rollout.controller.Controller`): everything a release
rollout guarantees carries over because it is the same code: stages (here *batches*) by node count,
the error-budget gate before every batch, the SLO-burn page checked at every look, the Prometheus
error limit, the operator's pause / resume / promote / abort, SQLite persistence after every
transition with write-ahead node records (a resumed controller asks each node first, so no node is
upgraded or rolled back twice), OpenTelemetry spans, notices and the report. What differs
(:class:`DriverController`):

* **Batches stratified by GPU model** (:func:`stratify`): the first batch (``canary`` in
  ``--batches``) holds one node of every GPU model, the rarest model first, so a regression that
  hits one model (one L40S among 19 H100s: 5% of the fleet, invisible in a fleet-wide p99) is met
  by that model's own canary before any further node is touched; later batches spread each model's
  remaining nodes evenly.
* **Compatibility gate for the driver** (:meth:`DriverController._compat`): every node's GPU with
  the new driver, and the release every node runs (its CUDA build, its engine) on the new driver
  (:func:`gpuobs.compat.inventory.judge_fleet` on the inventory with the driver replaced), else
  **Rejected** before any node is drained.
* **The node procedure** (:class:`DriverFleet.upgrade`, done for a whole batch at once, phase by
  phase, as the GPU Operator's upgrade controller does under ``maxParallelUpgrades``): cordon,
  drain, wait until drained, install the driver (the module reload resets the GPUs and restarts the
  engine), wait until the node is back, health check (``dcgmi diag``), uncordon. A node whose health
  check fails stays cordoned, and its GPU model's upgraded nodes are rolled back (**RolledBack**).
* **One verdict per GPU model** (:class:`ModelsAnalyzer`): the batch's nodes of each model against
  the not-yet-upgraded nodes of the same model, in the within-node design (each upgraded node's
  change from its own pre-upgrade period, less the baseline nodes' change over the same two periods:
  a difference in differences, the pre-period adjustment of Deng et al., "Improving the Sensitivity
  of Online Controlled Experiments by Utilizing Pre-Experiment Data", WSDM 2013; the analyzer's
  :meth:`gpuobs.canary.histstats.HistContext._within_node`). A model with no node left on the old
  driver is compared with every not-yet-upgraded node, in the within-node design only (the other
  models' change then only removes fleet-wide drift; their latency level differs from this model's by
  design, so a between-node comparison would read the model difference as the driver's effect): its
  latency tests are NoData until its nodes have pre-upgrade history, its advisory series are not
  compared, and the verdict says so. The
  config's alpha is split between the models judged and the batches analysed (Bonferroni), so a clean
  driver is rolled back with at most that probability over the whole upgrade. A model that PROMOTEs is done;
  the batch passes when every model has; any model's ROLLBACK ends it.
* **Rollback of the regressed model only**: a canary ROLLBACK (or a failed health check) rolls back
  the upgraded nodes of the GPU models that regressed (the same node procedure with the old driver)
  and halts the upgrade (**RolledBack**); nodes of the models that passed keep the new driver. An
  operator's abort, a freeze, the error limit or an inconclusive deadline roll back every touched
  node (**Aborted**), as a release rollout does.

Rollout ids are ``driver-<version>-<UTC stamp>``; the record's ``version`` is the driver version.
The last batch (100%) has no node left to compare with and is baked only, like a release's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from opentelemetry import trace

from gpuobs.canary.analyzer import AnalysisState
from gpuobs.canary.verdict import MetricResult, Verdict
from gpuobs.rollout.controller import Controller
from gpuobs.rollout.interfaces import Fleet, FleetError
from gpuobs.rollout.model import (
    ABORTED,
    CANARY_ROLLBACK,
    ROLLED_BACK,
    RolloutSpec,
    UsageError,
    parse_stages,
)
from gpuobs.rollout.store import NodeRecord, RolloutRecord, StageRecord

#: The engine field of a driver upgrade's spec names what is rolled out.
DRIVER_ENGINE = "NVIDIA driver"
#: ``--batches`` token for the stratified first batch: one node of every GPU model.
CANARY_BATCH = "canary"
#: What :meth:`DriverFleet.version` appends while the upgrade holds a node (an interrupted procedure).
IN_UPGRADE = " (in upgrade)"
#: What a batch's verdict is called when a node's health check failed after the install.
HEALTH_CHECK_ROLLBACK = "ROLLBACK (health check)"
#: How the reason of a rollback for a failed health check begins.
HEALTH_CHECK_REASON = "health check failed"


def short_model(model_name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``, ``"NVIDIA L40S"`` -> ``"L40S"`` (the first word after
    the vendor), for metric names and progress lines; the full modelName stays the grouping key."""
    words = [w for w in str(model_name).split() if w.upper() not in ("NVIDIA", "TESLA")]
    return words[0] if words else str(model_name) or "unknown"


def stratify(models: dict[str, str]) -> list[str]:
    """Hosts in upgrade order: one node of every GPU model first (rarest model first, then by name;
    within a model, hosts in name order), then every model's remaining nodes spread evenly (the
    i-th remaining node of a model with n remaining sorts at (i + 0.5) / n).

    ``models``: ``{host: modelName}``. Raises UsageError when empty."""
    if not models:
        raise UsageError("no serving nodes to upgrade")
    by_model: dict[str, list[str]] = {}
    for host in sorted(models):
        by_model.setdefault(models[host], []).append(host)
    order = sorted(by_model, key=lambda m: (len(by_model[m]), m))
    first = [by_model[m][0] for m in order]
    rest = sorted(((i + 0.5) / (len(by_model[m]) - 1), order.index(m), h)
                  for m in order for i, h in enumerate(by_model[m][1:]))
    return first + [h for _, _, h in rest]


def parse_batches(text: str, models: dict[str, str]) -> tuple[list[str], list[int]]:
    """``--batches`` over the serving nodes ``models`` (``{host: modelName}``) -> (hosts in upgrade
    order (:func:`stratify`), cumulative node counts). Items as ``--stages`` takes them (node counts,
    shares ``25%``), plus ``canary``: one node of every GPU model; a share after ``canary`` that gives
    no more nodes than the canary batch collapses into it. The last batch is all nodes.
    Raises UsageError (bad item, no node left for a baseline after the first batch)."""
    hosts = stratify(models)
    n_models = len(set(models.values()))
    items: list[str] = []
    canary = False
    for p in (p.strip() for p in str(text).split(",")):
        if p == CANARY_BATCH:
            canary = True
        # a share the canary batch already covers (25% of a 4-node fleet with 2 models) collapses into it
        if p == CANARY_BATCH or (canary and _share_nodes(p, len(hosts)) <= n_models):
            p = str(n_models)
        items.append(p)
    try:
        counts = parse_stages(",".join(items), len(hosts))
    except UsageError as err:
        raise UsageError(str(err).replace("--stages", "--batches")) from None
    return hosts, counts


def _share_nodes(item: str, serving: int) -> float:
    """The node count share ``item`` (``25%``) gives of ``serving`` nodes (rounded up, as
    :func:`parse_stages` does); infinity for anything else (a node count, a malformed item), which
    :func:`parse_stages` then judges."""
    try:
        share = float(item[:-1]) if item.endswith("%") else math.inf
        return math.ceil(share / 100 * serving) if 0 < share <= 100 else math.inf
    except (ValueError, OverflowError):
        return math.inf


def driver_spec(version: str, engine: str, cuda: str, hosts: list[str], stages: list[int],
                release: str = "", **timing: Any) -> RolloutSpec:
    """The :class:`RolloutSpec` of upgrading ``hosts`` to driver ``version`` in ``stages``; ``engine`` /
    ``cuda``: the release the fleet runs (what the compatibility gate re-checks on the new driver),
    ``release`` its version; timing keywords as RolloutSpec's."""
    named = f"release {release}: " if release else "release "
    return RolloutSpec(version, f"{DRIVER_ENGINE} ({named}{engine}, CUDA {cuda})", str(cuda), tuple(hosts),
                       tuple(stages), **timing)


def release_of(spec: RolloutSpec) -> tuple[str, str]:
    """``(release version or "", engine requirement)`` a :func:`driver_spec` carries."""
    text = spec.engine
    prefix = f"{DRIVER_ENGINE} (release "
    if not text.startswith(prefix):
        return "", text
    rest = text[len(prefix):].split(", CUDA", 1)[0]
    version, sep, engine = rest.partition(": ")
    return (version, engine) if sep else ("", rest)


@dataclass(frozen=True)
class NodeUpgrade:
    """What :meth:`DriverFleet.upgrade` did on one node: the driver it ran before, whether the
    install call was made (False: the node already had the driver), and the health check's failures
    (empty: passed, node back in service; else the node stays cordoned)."""

    previous: str
    installed: bool
    failures: tuple[str, ...] = ()


class DriverFleet(Fleet, Protocol):
    """A :class:`~gpuobs.rollout.interfaces.Fleet` whose versions are drivers (real one:
    :class:`gpuobs.rollout.adapters.drivers.StackDriverFleet`). Raises FleetError only.

    ``version(host)`` is the driver while the node is in service, and ``"<driver> (in upgrade)"``
    while the upgrade holds it cordoned, so an interrupted procedure is completed on resume.
    ``deploy(host, version)`` is ``upgrade([host], version)`` that raises FleetError on a failed
    health check (the rollback path)."""

    def model(self, host: str) -> str: ...
    def upgrade(self, hosts: list[str], version: str) -> dict[str, NodeUpgrade]: ...


# -- per-model analysis -------------------------------------------------------------------------

@dataclass
class ModelVerdict(Verdict):
    """A batch's look: every GPU model's verdict (``by_model``: modelName -> PROMOTE | ROLLBACK |
    HOLD, a model that PROMOTEd at an earlier look kept) folded into one :class:`Verdict` the
    rollout controller acts on: ROLLBACK if any model's is, PROMOTE when every model's is, else
    HOLD. Metric names carry the model (``L40S:ttft``); reasons, deciding tests and assumptions too."""

    by_model: dict[str, str] = field(default_factory=dict)
    #: The whole upgrade's alpha (this batch's ``alpha`` x the batches analysed).
    upgrade_alpha: float = 0.0

    def table(self, assumptions: bool = True) -> str:
        """:meth:`Verdict.table`, its alpha note saying how the upgrade's alpha is split."""
        lines = super().table(assumptions).splitlines()
        if lines and lines[-1].startswith("note: alpha ") and self.upgrade_alpha:
            lines[-1] = (f"note: alpha {self.alpha:g} is this batch's, split between its GPU models: the upgrade's "
                         f"{self.upgrade_alpha:g} over its analysed batches, so a clean driver is rolled back with "
                         f"probability at most {self.upgrade_alpha:g} over the whole upgrade")
        return "\n".join(lines)

    @property
    def regressed(self) -> list[str]:
        """The GPU models whose verdict is ROLLBACK."""
        return [m for m, v in self.by_model.items() if v == "ROLLBACK"]


def _renamed(m: MetricResult, short: str) -> MetricResult:
    return dataclasses.replace(m, name=f"{short}:{m.name}", title=f"{m.title} ({short})")


#: ``(horizon_s, interval_s, canary=, baseline=, history=, pre_stage_end=) -> analyzer``
#: (:func:`gpuobs.rollout.adapters.prometheus.analyzer_factory`).
SelectingFactory = Callable[..., Any]


class ModelsAnalyzer:
    """The analysis of one batch: one analyzer per GPU model, on node selectors by the fleet's
    identity label (``<label>=~"host1|host2"``).

    ``groups``: ``{modelName: (canary hosts, baseline hosts, note)}``; ``note`` says when the
    baseline is not the model's own nodes (that model is then judged ``within_only``). ``history``: every host of the batch and baseline (the
    within-node design's pre-stage query). ``pre_stage_end``: when the batch began (before the
    drain). ``batches``: how many batches of the upgrade are analysed (all but the last). Each model
    gets alpha / (models x batches). ``analyze(start, end, state)`` -> ModelVerdict;
    ``state`` keeps each model's looks under ``<model>::<metric>`` and a PROMOTE under
    ``<model>::promoted``. Backend errors propagate (the factory's analyzers raise
    SignalsUnavailable)."""

    def __init__(self, factory: SelectingFactory, horizon_s: float, interval_s: float, identity_label: str,
                 groups: dict[str, tuple[list[str], list[str], str]], pre_stage_end: float | None,
                 batches: int = 1):
        self.groups = groups
        self.identity_label = identity_label
        every = sorted({h for c, b, _ in groups.values() for h in (*c, *b)})
        # Bonferroni across the models and the upgrade's analysed batches: the whole upgrade's chance
        # of rolling back a clean driver stays within the config's family-wise alpha
        share = 1.0 / (len(groups) * max(1, batches))
        self.batches = max(1, batches)
        self.analyzers = {model: factory(horizon_s, interval_s, canary=self.selector(canary),
                                         baseline=self.selector(baseline), history=self.selector(every),
                                         pre_stage_end=pre_stage_end, alpha_share=share, within_only=bool(note))
                          for model, (canary, baseline, note) in groups.items()}

    def selector(self, hosts: list[str]) -> str:
        """:func:`node_selector` on the identity label."""
        return node_selector(self.identity_label, hosts)

    def analyze(self, start: float, end: float, state: AnalysisState) -> ModelVerdict:
        """One look at every model not yet promoted; see the class doc."""
        by_model, results, reasons, warnings, deciding, assumptions, designs = {}, [], [], [], [], [], []
        last: Verdict | None = None
        fracs, finals, reachable = [], [], True
        for model, analyzer in self.analyzers.items():
            short = short_model(model)
            done = f"{model}::promoted"
            if state.looks.get(done):
                by_model[model] = "PROMOTE"
                continue
            sub = AnalysisState({k.split("::", 1)[1]: v for k, v in state.looks.items()
                                 if k.startswith(f"{model}::") and k != done})
            v = analyzer.analyze(start, end, sub)
            last = v
            for k, looks in sub.looks.items():
                state.looks[f"{model}::{k}"] = looks
            if v.verdict == "PROMOTE":
                state.looks[done] = [(v.time_fraction, 1.0)]
            by_model[model] = v.verdict
            results += [_renamed(m, short) for m in v.metrics]
            note = self.groups[model][2]
            reasons += [f"{short}: {r}" for r in v.reasons]
            warnings += [f"{short}: {w}" for w in v.warnings] + ([f"{short}: {note}"] if note else [])
            deciding += [{**d, "metric": f"{short}:{d.get('metric', '')}"} for d in v.deciding]
            assumptions += [f"{short}: {a}" for a in v.assumptions]
            designs.append(f"{short}: {v.design or 'between-node'}")
            fracs.append(v.time_fraction)
            finals.append(v.final)
            reachable = reachable and v.promote_reachable
        verdicts = set(by_model.values())
        verdict = "ROLLBACK" if "ROLLBACK" in verdicts else "PROMOTE" if verdicts == {"PROMOTE"} else "HOLD"
        if verdict == "ROLLBACK":  # the regressed models' reasons: the others' are in the metrics
            reasons = [r for r in reasons if any(r.startswith(f"{short_model(m)}: ") for m, v in by_model.items()
                                                 if v == "ROLLBACK")]
        if verdict == "PROMOTE" and not reasons:
            reasons = [f"{short_model(m)}: PROMOTE at an earlier look" for m in by_model]
        canary = "; ".join(f"{short_model(m)}: {a.canary}" for m, a in self.analyzers.items())
        baseline = "; ".join(f"{short_model(m)}: {a.baseline}" for m, a in self.analyzers.items())
        alpha = sum(a.config.alpha for a in self.analyzers.values())
        frac = min(fracs) if fracs else 1.0
        return ModelVerdict(verdict, reasons, warnings, results, canary, baseline, start, end, frac,
                            all(finals) if finals else True, alpha, promote_reachable=reachable,
                            warmup_s=last.warmup_s if last else 0.0,
                            deciding=deciding if verdict == "ROLLBACK" else [], assumptions=assumptions,
                            design="; ".join(designs), by_model=by_model, upgrade_alpha=alpha * self.batches)


def node_selector(identity_label: str, hosts: list[str]) -> str:
    """``<identity label>=~"a|b"`` over ``hosts`` (names escaped for the RE2 regex and the PromQL string)."""
    return f'{identity_label}=~"{"|".join(_re_escape(h) for h in sorted(hosts))}"'


def report_selectors(spec_doc: dict[str, Any], stages: list[StageRecord], identity_label: str) -> tuple[str, str, str]:
    """What a driver upgrade's HTML report plots, ``(canary selector, baseline selector, GPU model)``: the
    nodes of one GPU model that one batch upgraded against the nodes its verdict compared them with
    (:func:`batch_groups`). The model: the first one a batch judged ROLLBACK, else the rarest model of
    the first batch (the one a fleet-wide view hides). Raises ValueError when no batch ran."""
    spec = RolloutSpec.from_dict(spec_doc)
    models = dict(spec_doc.get("gpu_models") or {})
    if not stages or not models:
        raise ValueError("no batch ran")
    pick = next(((st, m) for st in stages for m, v in (st.verdict_doc or {}).get("by_model", {}).items()
                 if v == "ROLLBACK"), None)
    if pick is None:
        st = stages[0]
        batch = list(spec.hosts[: spec.stages[0]])
        counts = {m: sum(1 for h in spec.hosts if models.get(h) == m) for m in {models.get(h, "") for h in batch}}
        pick = (st, min(counts, key=lambda m: (counts[m], m)))
    st, model = pick
    lo = spec.stages[st.idx - 1] if st.idx > 0 else 0
    batch, not_yet = list(spec.hosts[lo: spec.stages[st.idx]]), list(spec.hosts[spec.stages[st.idx]:])
    groups = batch_groups(models, batch, not_yet or [h for h in spec.hosts if h not in batch])
    canary, baseline, _ = groups[model]
    return node_selector(identity_label, canary), node_selector(identity_label, baseline), model


def _re_escape(text: str) -> str:
    """Escape RE2 metacharacters, doubling the backslash for the PromQL double-quoted string."""
    return "".join("\\\\" + c if c in r".^$*+?()[]{}|\\" else c for c in text)


def batch_groups(models: dict[str, str], batch: list[str], not_yet: list[str]) -> dict[str, tuple[list[str], list[str], str]]:
    """``{modelName: (batch hosts of the model, baseline hosts, note)}`` for one batch: the baseline is
    the model's not-yet-upgraded nodes, or every not-yet-upgraded node when the model has none left
    (``note`` says so). Models without a node in the batch are absent; so is every model when nothing
    is left to compare with (``not_yet`` empty)."""
    out: dict[str, tuple[list[str], list[str], str]] = {}
    if not not_yet:
        return out
    for model in sorted({models[h] for h in batch}):
        canary = [h for h in batch if models[h] == model]
        same = [h for h in not_yet if models[h] == model]
        note = "" if same else (f"no {short_model(model)} node is left on the old driver: compared with the "
                                f"{len(not_yet)} not-yet-upgraded node(s) of other models (their change removes "
                                "fleet-wide drift; the node's own history removes its offset)")
        out[model] = (canary, same or list(not_yet), note)
    return out


# -- the controller -----------------------------------------------------------------------------

class DriverController(Controller):
    """The rollout controller for drivers; ``fleet`` is a :class:`DriverFleet`, ``analyzers`` a
    :data:`SelectingFactory`; ``identity_label``: the fleet config's (node selectors)."""

    fleet: DriverFleet
    group, noun = "upgrade", "driver upgrade"
    stage_word = "batch"

    def plain_version(self, version: str) -> str:
        """The driver without the ``" (in upgrade)"`` mark (a node down or held reports it)."""
        return version.removesuffix(IN_UPGRADE)

    def late_deploy(self, spec: RolloutSpec, st: StageRecord, node: NodeRecord) -> tuple[str, str, str] | None:
        """An install a killed controller made but did not record is logged once, when found."""
        return ((spec.version, node.previous, f"batch {st.idx + 1} (recorded after a restart)")
                if node.previous != spec.version else None)

    def __init__(self, *args: Any, identity_label: str = "Hostname", **kw: Any):
        super().__init__(*args, **kw)
        self.identity_label = identity_label

    def id_stem(self, spec: RolloutSpec) -> str:
        return f"driver-{spec.version}"

    def describe(self, spec: RolloutSpec) -> str:
        return f"NVIDIA driver {spec.version} ({spec.engine.removeprefix(DRIVER_ENGINE).strip(' ()')})"

    def record_extras(self, spec: RolloutSpec) -> dict[str, Any]:
        """Persisted with the rollout: every host's GPU model (``gpu_models``)."""
        return {"gpu_models": {h: self.fleet.model(h) for h in spec.hosts}}

    @staticmethod
    def models(rec: RolloutRecord) -> dict[str, str]:
        """``{host: modelName}`` recorded when the upgrade was created."""
        return dict(rec.spec.get("gpu_models") or {})

    # ---- gates ---------------------------------------------------------------------------------
    def compat_subject(self, spec: RolloutSpec, rows: list[Any]) -> tuple[list[Any], Any, str]:
        """The driver's compatibility gate: the fleet's release on every node's GPU with the new driver."""
        version, engine = release_of(spec)
        release = dataclasses.replace(spec.release, version=f"{version or 'the fleet'} on driver {spec.version}",
                                      engine=engine)
        return [dataclasses.replace(r, driver=spec.version) for r in rows], release, f"driver {spec.version}"

    # ---- batches -------------------------------------------------------------------------------
    def batch(self, spec: RolloutSpec, idx: int) -> tuple[list[str], list[str]]:
        """(the hosts batch ``idx`` upgrades, the hosts not yet upgraded after it)."""
        lo = spec.stages[idx - 1] if idx > 0 else 0
        return list(spec.hosts[lo: spec.stages[idx]]), list(spec.hosts[spec.stages[idx]:])

    def stage_analyzer(self, rec: RolloutRecord, spec: RolloutSpec, st: StageRecord) -> Any:
        """:class:`ModelsAnalyzer` of the batch's new nodes per GPU model."""
        batch, not_yet = self.batch(spec, st.idx)
        groups = batch_groups(self.models(rec), batch, not_yet)
        return ModelsAnalyzer(self.analyzers, spec.stage_timeout_s, spec.interval_s, self.identity_label, groups,
                              st.started_at, batches=len(spec.stages) - 1)

    def _deploy(self, rec: RolloutRecord, spec: RolloutSpec, st: StageRecord) -> bool:
        """Upgrade the batch's hosts not yet on the driver, all at once (write-ahead node records);
        False when it failed (a rollback has then begun: RolledBack for failed health checks, scoped
        to their GPU models; Aborted for a fleet error)."""
        name = self._stage_name(spec, st.idx)
        self.store.save_stage(rec.id, st)
        todo: list[NodeRecord] = []
        try:
            for host in st.hosts:
                node = self._claim(rec, spec, st, host)
                if node is not None:
                    todo.append(node)
            done = self.fleet.upgrade([n.hostname for n in todo], spec.version) if todo else {}
        except FleetError as err:
            self._begin_rollback(rec, ABORTED, f"{name}: upgrade failed: {err}", st, "aborted")
            return False
        models = self.models(rec)
        failed: dict[str, list[str]] = {}
        for node in todo:
            res = done[node.hostname]
            # an install a killed controller made but did not record is logged now, once
            call = ((spec.version, node.previous, f"batch {st.idx + 1}" + ("" if res.installed else
                                                                             " (recorded after a restart)"))
                    if res.installed or node.previous != spec.version else None)
            self.store.set_node(rec.id, dataclasses.replace(node, status="deployed"), deploy=call)
            trace.get_current_span().add_event("upgrade", {"host": node.hostname, "driver": spec.version,
                                                           "previous": node.previous})
            if res.failures:
                failed.setdefault(models.get(node.hostname, "unknown"), []).append(
                    f"{node.hostname}: {'; '.join(res.failures)}")
        ups = [f"{n.hostname} ({short_model(models.get(n.hostname, ''))}, {n.previous} -> {spec.version})"
               for n in todo]
        self._say(rec, f"{name}: {len(st.hosts)}/{len(spec.hosts)} node(s) on driver {spec.version}"
                       + (f", upgraded {', '.join(ups)}" if ups else ""))
        if failed:
            st.verdict = HEALTH_CHECK_ROLLBACK
            st.verdict_doc = {"verdict": "ROLLBACK", "by_model": {m: "ROLLBACK" for m in failed},
                              "reasons": [f"{short_model(m)}: health check failed on {'; '.join(f)}"
                                          for m, f in failed.items()]}
            self.store.save_stage(rec.id, st)
            self._begin_rollback(rec, ROLLED_BACK, f"{HEALTH_CHECK_REASON} after installing driver {spec.version} "
                                                   f"in {name}: " + "; ".join(st.verdict_doc["reasons"]),
                                 st, "failed")
            return False
        return True

    # ---- rollback ------------------------------------------------------------------------------
    def regressed_models(self, rec: RolloutRecord) -> list[str]:
        """The GPU models a failed batch judged ROLLBACK (canary analysis or health check); empty
        when the rollback is not a model's regression (abort, freeze, errors, deadline)."""
        if rec.target != ROLLED_BACK or not str(rec.reason).startswith((CANARY_ROLLBACK, HEALTH_CHECK_REASON)):
            return []  # e.g. an SLO page: every node goes back, whatever an earlier look said
        out: list[str] = []
        for st in self.store.stages(rec.id):
            if st.status == "failed":
                out += [m for m, v in (st.verdict_doc or {}).get("by_model", {}).items()
                        if v == "ROLLBACK" and m not in out]
        return out

    def nodes_to_revert(self, rec: RolloutRecord) -> list[NodeRecord]:
        """A model's regression: only that model's nodes; otherwise every touched node."""
        nodes = super().nodes_to_revert(rec)
        regressed = self.regressed_models(rec)
        if not regressed:
            return nodes
        models = self.models(rec)
        return [n for n in nodes if models.get(n.hostname) in regressed]


def check_models(models: dict[str, str]) -> None:
    """Refuse an upgrade plan whose nodes' GPU models are unknown (empty modelName). Raises UsageError."""
    blank = sorted(h for h, m in models.items() if not m)
    if blank:
        raise UsageError(f"no GPU model known for {', '.join(blank)} (the node's status has no gpu_model)")


def check_target(version: str, known: list[str], drivers: dict[str, str]) -> None:
    """Refuse ``--driver version`` before anything is written: not one of the ``known`` versions (the
    driver catalogue the nodes install from), or already the driver of every serving node (``drivers``:
    ``{host: driver it runs}``; nothing to upgrade). Raises UsageError naming ``--driver``."""
    if version not in known:
        raise UsageError(f"--driver: unknown driver version {version!r}; known: {', '.join(known)}")
    if drivers and set(drivers.values()) == {version}:
        raise UsageError(f"--driver: every serving node already runs driver {version}; nothing to upgrade "
                         f"(known drivers: {', '.join(v for v in known if v != version)})")
