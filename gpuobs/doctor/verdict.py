"""Judge a :class:`~gpuobs.doctor.snapshot.Snapshot`: per alert family live / degraded / blind, why, and
the fix; plus fleet-level findings about selectors and node identity. Pure functions, no I/O.

How a family is judged (definitions in :mod:`gpuobs.mixin.families`): each *unit* is judged on its own,
then the family takes the worst unit. A unit is an ``up`` DCGM target for families with DCGM signals,
an ``up`` vLLM target for serving families, else the whole TSDB (application-only families). On a unit:

* the enhanced path works when every ``enhanced`` signal is there, or any ``alternatives`` one is;
* the stock path works when every ``stock`` signal is there (a ``sparse`` one, the Xid gauge, is presumed
  when the target serves the stock field set: dcgm-exporter 4.4+ omits it until the first Xid);
* live = enhanced works (or there is no enhanced path and stock works); degraded = only stock works;
  blind = neither, or the family reads the driver label and the target has none;
* then identity: a target without the identity label is blind for an ``identity_join`` family and at best
  degraded for the others (their alerts' degraded twins page it, named by its instance); two targets with one identity value, or an identity
  that is the exporter pod's name, make it at best degraded;
* MIG: a signal of the path in use that some MIG instances lack (GPU_UTIL: dcgm-exporter #105; FB_*
  on H100 instances: #512, #380) makes it at best degraded.

Signals on ``app`` jobs count wherever they are in the TSDB; ``agent`` signals count on a target when a
series with the target's identity exists. Exit code (:attr:`Report.exit_code`): 1 when any paging
family that was not skipped is blind, else 0.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from gpuobs.doctor.fixes import (
    CSV_LINES,
    LEGACY_NAMES,
    POD_SUFFIX_ALPHABET,
    Fix,
    csv_fix,
    identity_fixes,
    node_name_fix,
    selector_fix,
)
from gpuobs.doctor.snapshot import HOST_LABELS, Snapshot, Target, TargetKey
from gpuobs.mixin.families import FAMILIES, Family, Signal

STATUSES = ("live", "degraded", "blind")
RANK = {s: i for i, s in enumerate(STATUSES)}
#: A DaemonSet pod name of dcgm-exporter as Hostname (the Helm chart's and GPU Operator's pod names).
POD_NAME = re.compile(rf"^(?:[a-z0-9-]*-)?dcgm-exporter-[{POD_SUFFIX_ALPHABET}]{{5}}$")
#: The metric that says "this target is a dcgm-exporter serving the stock field set".
STOCK_PROBE = "DCGM_FI_DEV_GPU_TEMP"
MAX_NAMES = 6


@dataclass
class FamilyVerdict:
    """One family's verdict: ``status`` (live/degraded/blind, or ``skipped``), ``why`` (one line per reason)
    and ``fixes``."""

    name: str
    alerts: tuple[str, ...]
    paging: bool
    status: str
    why: list[str] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)
    note: str = ""
    runbook: str = ""

    def to_dict(self) -> dict:
        return {"family": self.name, "alerts": list(self.alerts), "paging": self.paging, "status": self.status,
                "why": self.why, "fixes": [f.to_dict() for f in self.fixes], "note": self.note,
                "runbook": self.runbook}


@dataclass
class Finding:
    """A fleet-level problem: ``severity`` error/warning/info, a stable ``code``, the ``message``, the
    targets it concerns and its fixes."""

    severity: str
    code: str
    message: str
    targets: list[str] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"severity": self.severity, "code": self.code, "message": self.message, "targets": self.targets,
                "fixes": [f.to_dict() for f in self.fixes]}


@dataclass
class Report:
    """Everything doctor says about one Prometheus."""

    prometheus: str
    identity_label: str
    selectors: dict[str, str]
    targets: dict[str, dict[str, int]]
    families: list[FamilyVerdict]
    findings: list[Finding]

    @property
    def blind_paging(self) -> list[str]:
        return [f.name for f in self.families if f.paging and f.status == "blind"]

    @property
    def exit_code(self) -> int:
        """1 when a paging family is blind, else 0."""
        return 1 if self.blind_paging else 0

    def csv_lines(self) -> list[str]:
        """Every counters-CSV line any family's fix asks for, once, in family order."""
        out: list[str] = []
        for fam in self.families:
            for fix in fam.fixes:
                if fix.kind == "csv":
                    out += [line for line in fix.text.splitlines() if line not in out]
        return out

    def to_dict(self) -> dict:
        return {"prometheus": self.prometheus, "identity_label": self.identity_label, "selectors": self.selectors,
                "targets": self.targets, "families": [f.to_dict() for f in self.families],
                "findings": [f.to_dict() for f in self.findings], "csv_lines": self.csv_lines(),
                "blind_paging": self.blind_paging, "exit_code": self.exit_code}


def _names(items: Iterable[str]) -> str:
    items = sorted(set(items))
    more = len(items) - MAX_NAMES
    return ", ".join(items[:MAX_NAMES]) + (f" and {more} more" if more > 0 else "")


def _where(units: list[str], total: int, what: str) -> str:
    if len(units) >= total:
        return f"on all {total} {what}" if total > 1 else f"on the {what.rstrip('s')}"
    return f"on {len(units)} of {total} {what}: {_names(units)}"


@dataclass
class _Context:
    """Derived facts shared by the checks."""

    snap: Snapshot
    ident: dict[TargetKey, str]  # identity per DCGM/vLLM target ("" missing)
    dup: dict[TargetKey, str]  # targets whose identity another target of the same kind shares
    unstable: set[TargetKey]  # identity is the exporter pod's name (changes on every rollout)
    no_driver: set[TargetKey]
    dcgm_jobs_elsewhere: list[str]  # jobs serving DCGM fields that the DCGM selector does not match
    vllm_jobs_elsewhere: list[str]
    vllm_anywhere: bool


def _jobs_serving(snap: Snapshot, metrics: Iterable[str]) -> set[str]:
    return {job for m in metrics for job in snap.anywhere.get(m, {})}


def _context(snap: Snapshot, families: tuple[Family, ...]) -> _Context:
    ident: dict[TargetKey, str] = {}
    page_idents: dict[TargetKey, set[str]] = defaultdict(set)
    for h in snap.hosts:
        if h.identity:
            page_idents[(h.job, h.instance)].add(h.identity)
    for t in snap.dcgm_targets:
        vals = page_idents.get(t.key, set())
        ident[t.key] = t.identity or (next(iter(vals)) if len(vals) == 1 else "")
    for t in snap.vllm_targets:
        ident[t.key] = t.identity
    dup: dict[TargetKey, str] = {}
    for t in snap.dcgm_targets:  # identity read from the page with several values on one target
        vals = page_idents.get(t.key, set())
        if not t.identity and len(vals) > 1:
            ident[t.key] = "|".join(sorted(vals))
            dup[t.key] = ident[t.key]
    by_value: dict[str, list[TargetKey]] = defaultdict(list)
    for t in snap.dcgm_targets:
        if ident[t.key] and t.key not in dup:
            by_value[ident[t.key]].append(t.key)
    for value, keys in by_value.items():
        if len(keys) > 1:
            dup.update({k: value for k in keys})
    unstable: set[TargetKey] = set()
    if snap.identity_label in HOST_LABELS:
        unstable = {t.key for t in snap.dcgm_targets if _pod_named(ident[t.key], t)}
    drivers: dict[TargetKey, set[str]] = defaultdict(set)
    for h in snap.hosts:
        drivers[(h.job, h.instance)].add(h.driver)
    no_driver = {k for k, vals in drivers.items() if "" in vals}
    dcgm_metrics = {s.metric for f in families for s in (*f.stock, *f.enhanced, *f.alternatives)
                    if s.job == "dcgm" and s.metric != "up"}
    vllm_metrics = {s.metric for f in families for s in (*f.stock, *f.enhanced, *f.alternatives)
                    if s.job == "vllm" and s.metric != "up"}
    vllm_metrics |= {LEGACY_NAMES[m][0] for m in vllm_metrics if m in LEGACY_NAMES}
    dcgm_jobs = {t.job for t in snap.dcgm_targets}
    vllm_jobs = {t.job for t in snap.vllm_targets}
    return _Context(
        snap, ident, dup, unstable, no_driver,
        sorted(_jobs_serving(snap, dcgm_metrics) - dcgm_jobs),
        sorted(_jobs_serving(snap, vllm_metrics) - vllm_jobs),
        bool(_jobs_serving(snap, vllm_metrics)) or bool(snap.vllm_targets))


def _pod_named(hostname: str, target: Target) -> bool:
    return bool(hostname) and (hostname == target.labels.get("pod") or bool(POD_NAME.match(hostname)))


# ---- fleet-level findings ----------------------------------------------------------------------------------
def _selector_findings(ctx: _Context) -> list[Finding]:
    snap, out = ctx.snap, []
    for kind, targets, sel, elsewhere, flag in (
            ("dcgm", snap.dcgm_targets, snap.dcgm_selector, ctx.dcgm_jobs_elsewhere, "--dcgm-selector"),
            ("vllm", snap.vllm_targets, snap.vllm_selector, ctx.vllm_jobs_elsewhere, "--vllm-selector")):
        label = "DCGM" if kind == "dcgm" else "vLLM"
        if not targets:
            if elsewhere:
                out.append(Finding("error", f"{kind}-selector-matches-nothing",
                                   f"the {label} selector {{{sel}}} matches no target, but job(s) {_names(elsewhere)} "
                                   f"serve {label} metrics: every rule that uses the selector is silent",
                                   elsewhere, [selector_fix(kind, elsewhere, flag)]))
            elif kind == "dcgm" or ctx.vllm_anywhere:
                out.append(Finding("error", f"{kind}-selector-matches-nothing",
                                   f"the {label} selector {{{sel}}} matches no target and no {label} metric is in "
                                   f"this Prometheus: is the exporter scraped at all?"))
            else:
                out.append(Finding("info", "no-vllm", "no vLLM target and no vLLM metric in this Prometheus: the "
                                   "serving families are blind (skip them with --skip kv-cache,slo if this fleet "
                                   "serves no models)"))
            continue
        if elsewhere:
            out.append(Finding("warning", f"{kind}-selector-partial",
                               f"job(s) {_names(elsewhere)} also serve {label} metrics but the {label} selector "
                               f"{{{sel}}} does not match them: their nodes are not watched",
                               elsewhere, [selector_fix(kind, sorted({t.job for t in targets} | set(elsewhere)), flag)]))
        down = [t.name for t in targets if not t.up]
        if down:
            out.append(Finding("warning", f"{kind}-targets-down",
                               f"{len(down)} of {len(targets)} {label} targets are down (up == 0): their pages "
                               f"could not be checked", down))
    return out


def _identity_findings(ctx: _Context) -> list[Finding]:
    snap, out, lab = ctx.snap, [], ctx.snap.identity_label
    snippets_given = False
    for kind, targets in (("dcgm", snap.dcgm_targets), ("vllm", snap.vllm_targets)):
        label = "DCGM" if kind == "dcgm" else "vLLM"
        missing = [t.name for t in targets if not ctx.ident[t.key]]
        if missing:
            sev = "error" if len(missing) == len(targets) else "warning"
            out.append(Finding(sev, f"{kind}-identity-missing",
                               f"identity label {lab!r} missing or empty {_where(missing, len(targets), label + ' targets')}: "
                               f"their alerts carry no node, per-node rules (GPU missing, KV-cache joins) skip them, "
                               f"inhibitions never match them, dashboards merge them"
                               + (" (same relabelling as above, on this job's scrape)" if snippets_given else ""),
                               missing, [] if snippets_given else identity_fixes(lab)))
            snippets_given = True
    groups: dict[str, list[Target]] = defaultdict(list)
    for t in snap.dcgm_targets:
        if t.key in ctx.dup:
            groups[ctx.dup[t.key]].append(t)
    for value, ts in sorted(groups.items()):
        out.append(Finding("error", "dcgm-identity-not-unique",
                           f"{len(ts)} DCGM targets share {lab}={value!r} (instances {_names(t.instance for t in ts)}): "
                           f"their GPUs merge in rules, pages and dashboards",
                           [f"{t.job}/{t.instance}" for t in ts], identity_fixes(lab)))
    return out + _host_label_findings(ctx)


def _host_label_findings(ctx: _Context) -> list[Finding]:
    snap, out = ctx.snap, []
    lab = snap.identity_label
    is_identity = lab in HOST_LABELS
    targets = {t.key: t for t in snap.dcgm_targets}
    per_target: dict[TargetKey, set[tuple[str, str]]] = defaultdict(set)
    for h in snap.hosts:
        per_target[(h.job, h.instance)].add((h.hostname, h.hostname_lower))
    if not per_target:
        return out
    total = len(per_target)

    def name(k: TargetKey) -> str:
        t = targets.get(k)
        return t.name if t else f"{k[0]}/{k[1]}"

    localhost = [name(k) for k, vals in per_target.items() if any("localhost" in v for v in vals)]
    pod = [name(k) for k, vals in per_target.items()
           if k in targets and any(_pod_named(v[0] or v[1], targets[k]) for v in vals)]
    lower = [name(k) for k, vals in per_target.items() if any(v[1] and not v[0] for v in vals)]
    absent = [name(k) for k, vals in per_target.items() if ("", "") in vals]
    multi = [f"{name(k)} ({_names(v[0] or v[1] for v in vals)})" for k, vals in per_target.items()
             if len({v[0] or v[1] for v in vals if v[0] or v[1]}) > 1]
    by_host: dict[str, set[str]] = defaultdict(set)
    for k, vals in per_target.items():
        for v in vals:
            if (v[0] or v[1]) and (v[0] or v[1]) != "localhost":
                by_host[v[0] or v[1]].add(ctx.ident.get(k) or f"{k[0]}/{k[1]}")
    shared = [f"{h} ({_names(ids)})" for h, ids in sorted(by_host.items()) if len(ids) > 1]
    severity = "error" if is_identity else "warning"
    #: when the host label is the identity, the fix is to key on a scrape-side label instead
    switch = ([Fix("identity", "key on the scrape's node label instead of the exporter's host label",
                   "gpuobs doctor --identity-label node   # and the rules' fleet config: identity_label: node")]
              + identity_fixes("node")) if is_identity else []
    consequence = ("it is the identity label, so nodes merge" if is_identity else
                   f"never key anything on it; gpuobs groups by {lab!r}")
    if localhost:
        out.append(Finding(severity, "hostname-localhost",
                           f'Hostname is "localhost" {_where(localhost, total, "DCGM targets")} (dcgm-exporter started '
                           f"with -r prints the host engine's host: internal/pkg/hostname/hostname.go @ 4.5.3-4.8.2): "
                           f"{consequence}", localhost, switch))
    if pod:
        out.append(Finding(severity, "hostname-pod-name",
                           f"Hostname is the exporter pod's name {_where(pod, total, 'DCGM targets')} (no NODE_NAME in the "
                           f"container): it changes on every exporter rollout; {consequence}", pod, [node_name_fix()]))
    if lower:
        out.append(Finding("error" if lab == "Hostname" else "info", "hostname-lowercase",
                           f"the host label is lowercase `hostname` {_where(lower, total, 'DCGM targets')} (dcgm-exporter "
                           f"master after PR #655): dashboards or rules keyed on `Hostname` miss these nodes", lower))
    if absent:
        out.append(Finding(severity if is_identity else "info", "hostname-absent",
                           f"no host label (Hostname/hostname) {_where(absent, total, 'DCGM targets')} (dcgm-exporter -n): "
                           f"only a scrape-side label such as {'node' if is_identity else lab!r} can identify the node",
                           absent, switch))
    if multi:
        out.append(Finding(severity, "hostname-not-unique-per-node",
                           f"{len(multi)} DCGM target(s) carry two different host-label values: {_names(multi)} "
                           f"(two exporters behind one target, or a stale relabelling)", multi))
    if shared:
        out.append(Finding(severity, "hostname-shared",
                           f"one host-label value on several nodes: {_names(shared)}", shared))
    return out


def _driver_findings(ctx: _Context) -> list[Finding]:
    snap = ctx.snap
    keys = {(h.job, h.instance) for h in snap.hosts}
    if not ctx.no_driver:
        return []
    names = sorted({ctx.ident.get(k) or f"{k[0]}/{k[1]}" for k in ctx.no_driver})
    return [Finding("warning", "driver-label-missing",
                    f"the DCGM_FI_DRIVER_VERSION label is missing {_where(names, len(keys), 'DCGM targets')} (the "
                    f"dcgm-exporter Helm chart's ConfigMap drops it in charts 4.0.0-4.4.2 and 4.5.3-4.8.2): driver skew "
                    f"cannot be seen there", names, [csv_fix(["DCGM_FI_DRIVER_VERSION"])])]


def _workload_findings(ctx: _Context) -> list[Finding]:
    if not ctx.snap.exported_pod_jobs:
        return []
    return [Finding("info", "exported-workload-labels",
                    f"job(s) {_names(ctx.snap.exported_pod_jobs)} store the GPU's workload as exported_pod / "
                    f"exported_namespace / exported_container (ServiceMonitor with honorLabels: false): per-workload "
                    f"panels and routes must read the exported_* labels", sorted(ctx.snap.exported_pod_jobs))]


def _exporter_generation_findings(ctx: _Context) -> list[Finding]:
    """dcgm-exporter before 3.3.6 (no ``err_code`` on the Xid gauge; its value is the last code): the
    stock Xid path pages a change of that code (gpu-xid.yml), so a repeat of the same code is invisible."""
    legacy = ctx.snap.legacy_xid_targets
    if not legacy:
        return []
    names = sorted({ctx.ident.get(k) or "/".join(p for p in k if p) for k in legacy})
    total = max(len(ctx.snap.dcgm_targets), len(names))
    return [Finding("warning", "dcgm-exporter-before-3.3.6",
                    f"DCGM_FI_DEV_XID_ERRORS has no err_code label {_where(names, total, 'DCGM targets')} "
                    f"(dcgm-exporter before 3.3.6: the value is the last Xid code): Xids page when that code changes, "
                    f"a repeat of the same code does not; upgrade dcgm-exporter, or run `gpuobs logwatch` (every "
                    f"kernel-log Xid) or enable DCGM_EXP_XID_ERRORS_COUNT where available", names)]


# ---- per family ---------------------------------------------------------------------------------------------
def _present(ctx: _Context, s: Signal, unit: TargetKey | None) -> bool:
    snap = ctx.snap
    if s.job in ("dcgm", "vllm"):
        if s.metric == "up":
            return bool(snap.dcgm_targets if s.job == "dcgm" else snap.vllm_targets) if unit is None else True
        served = snap.served.get(s.metric, set())
        return bool(served) if unit is None else unit in served
    where = snap.anywhere.get(s.metric, {})
    if s.job == "app" or unit is None:
        return bool(where)
    ident = ctx.ident.get(unit, "")
    idents = set().union(*where.values()) if where else set()
    return ident in idents if ident else bool(idents)


def _units(ctx: _Context, fam: Family) -> tuple[str, list[Target] | None]:
    jobs = {s.job for s in (*fam.stock, *fam.enhanced, *fam.alternatives)}
    if "dcgm" in jobs:
        return "dcgm", [t for t in ctx.snap.dcgm_targets if t.up]
    if "vllm" in jobs:
        return "vllm", [t for t in ctx.snap.vllm_targets if t.up]
    return "app", None


def _missing_reason(ctx: _Context, s: Signal, path: str) -> str:
    snap = ctx.snap
    text = f"{s.metric} missing ({path} path)" + (" in every job" if s.job == "app" else "")
    sel_jobs = {t.job for t in (snap.dcgm_targets if s.job == "dcgm" else snap.vllm_targets)}
    other = sorted(set(snap.anywhere.get(s.metric, {})) - sel_jobs) if s.job in ("dcgm", "vllm") else []
    if other:
        text += f"; served by job(s) {_names(other)}, outside the {s.job} selector"
    legacy = LEGACY_NAMES.get(s.metric)
    if legacy and snap.anywhere.get(legacy[0]):
        text += f"; {legacy[0]} is there instead: {legacy[1]}"
    return text


def _signal_fixes(signals: list[Signal]) -> list[Fix]:
    fixes, csv = [], [s.metric for s in signals if s.metric in CSV_LINES]
    if csv:
        fixes.append(csv_fix(list(dict.fromkeys(csv))))
    by_enable: dict[str, list[str]] = {}
    for s in signals:
        if s.metric not in CSV_LINES and s.enable:
            by_enable.setdefault(s.enable, []).append(s.metric)
    for enable, metrics in by_enable.items():
        fixes.append(Fix("instrument", f"to get {' / '.join(metrics)}", enable))
    return fixes


def judge_family(ctx: _Context, fam: Family) -> FamilyVerdict:
    """The verdict of one family over the snapshot (see the module docstring)."""
    snap = ctx.snap
    kind, units = _units(ctx, fam)
    verdict = FamilyVerdict(fam.name, fam.alerts, fam.paging, "blind", note=fam.note, runbook=fam.runbook)
    if units is not None and not units:
        targets = snap.dcgm_targets if kind == "dcgm" else snap.vllm_targets
        sel = snap.dcgm_selector if kind == "dcgm" else snap.vllm_selector
        label = "DCGM" if kind == "dcgm" else "vLLM"
        if targets:
            verdict.why.append(f"none of the {len(targets)} {label} targets is up")
        else:
            elsewhere = ctx.dcgm_jobs_elsewhere if kind == "dcgm" else ctx.vllm_jobs_elsewhere
            verdict.why.append(f"the {label} selector {{{sel}}} matches no target"
                               + (f" (job(s) {_names(elsewhere)} serve {label} metrics)" if elsewhere else ""))
            if elsewhere:
                flag = "--dcgm-selector" if kind == "dcgm" else "--vllm-selector"
                verdict.fixes.append(selector_fix(kind, elsewhere, flag))
        return verdict

    reasons: dict[str, list[str]] = defaultdict(list)
    statuses: list[str] = []
    want_stock: list[Signal] = []
    want_enh: list[Signal] = []
    identity_fix = False
    for unit in units if units is not None else [None]:
        key = unit.key if unit is not None else None
        uname = "fleet" if key is None else (ctx.ident.get(key) or f"{key[0]}/{key[1]}")
        if key in ctx.dup:
            uname += f" ({key[1]})"
        stock_missing, presumed = [], []
        for s in fam.stock:
            if _present(ctx, s, key):
                continue
            if s.sparse and key is not None and key in snap.served.get(STOCK_PROBE, set()):
                presumed.append(s)
            else:
                stock_missing.append(s)
        enh_missing = [s for s in fam.enhanced if not _present(ctx, s, key)]
        alt_ok = any(_present(ctx, s, key) for s in fam.alternatives)
        enh_ok = (bool(fam.enhanced) and not enh_missing) or alt_ok
        stock_ok = bool(fam.stock) and not stock_missing and not fam.blind_on_stock
        if enh_ok:
            status = "live"
            path = [s for s in (*fam.enhanced, *fam.alternatives) if _present(ctx, s, key)]
        elif not fam.enhanced and not fam.alternatives and stock_ok:
            status, path = "live", list(fam.stock)
        elif stock_ok:
            status, path = "degraded", list(fam.stock)
        else:
            status, path = "blind", []
        if not enh_ok and (fam.enhanced or fam.alternatives):
            for s in enh_missing:
                reasons[_missing_reason(ctx, s, "enhanced")].append("fleet" if s.job == "app" else uname)
            if fam.alternatives and not fam.enhanced:
                reasons[f"none of {', '.join(s.metric for s in fam.alternatives)} (enhanced path)"].append(uname)
            want_enh += enh_missing + ([fam.alternatives[0]] if fam.alternatives else [])
        if stock_missing and not enh_ok:
            for s in stock_missing:
                reasons[_missing_reason(ctx, s, "stock")].append("fleet" if s.job == "app" else uname)
            want_stock += stock_missing
        if presumed and not enh_ok:
            for s in presumed:
                reasons[f"{s.metric} not seen {{where}}: dcgm-exporter 4.4+ serves it only after the first Xid, "
                        f"so it is presumed on (its line is in the stock CSV; check your counters file keeps "
                        f"it)"].append(uname)
        if fam.needs_driver_label and key in ctx.no_driver:
            status = "blind"
            reasons["DCGM_FI_DRIVER_VERSION label missing (the Helm chart's ConfigMap drops it)"].append(uname)
            want_stock.append(Signal("DCGM_FI_DRIVER_VERSION"))
        if key is not None and not fam.fleet_wide:
            if not ctx.ident.get(key):
                status = "blind" if fam.identity_join else max(status, "degraded", key=RANK.get)
                reasons[f"identity label {snap.identity_label!r} missing or empty {{where}}"
                        + (": none of the family's alerts can fire without it (they read per-node recordings "
                           "or join across jobs)" if fam.identity_join
                           else ": its pages name the scrape target (instance), not the node")].append(uname)
                identity_fix = True
            elif key in ctx.dup or key in ctx.unstable:
                status = max(status, "degraded", key=RANK.get)
                why = ("is the exporter pod's name (changes on rollout)" if key not in ctx.dup else
                       "has several values on one target" if "|" in ctx.dup[key] and not unit.identity else
                       "shared with another target")
                reasons[f"identity {snap.identity_label}={ctx.ident[key]!r} {why} {{where}}"].append(uname)
                identity_fix = True
            total = snap.mig_total.get(key, 0)
            for s in path:
                have = snap.mig_served.get(s.metric, {}).get(key, 0)
                if (s.job == "dcgm" and s.metric != "up" and not s.sparse and total and have < total
                        and status != "blind"):
                    status = max(status, "degraded", key=RANK.get)
                    reasons[f"{s.metric} absent on {total - have} of {total} MIG instances {{where}} "
                            f"(dcgm-exporter #105, #512, #380): those instances are blind for this path"].append(uname)
        statuses.append(status)

    verdict.status = max(statuses, key=RANK.get) if statuses else "blind"
    for opt in fam.optional:
        if opt.metric == "up" and opt.job == "vllm" and not snap.vllm_targets and ctx.vllm_anywhere:
            verdict.status = max(verdict.status, "degraded", key=RANK.get)
            reasons["up of the vLLM selector matches nothing: ServingEngineDown cannot fire"].append("fleet")
            flag = "--vllm-selector"
            if ctx.vllm_jobs_elsewhere:
                verdict.fixes.append(selector_fix("vllm", ctx.vllm_jobs_elsewhere, flag))
    total = len(units) if units else 1
    what = ("DCGM targets" if kind == "dcgm" else "vLLM targets")
    for text, names in reasons.items():
        if set(names) == {"fleet"}:
            verdict.why.append(text.replace(" {where}", ""))
        else:
            where = _where(list(dict.fromkeys(u for u in names if u != "fleet")), total, what)
            verdict.why.append(text.replace("{where}", where) if "{where}" in text else f"{text} {where}")
    if verdict.status == "blind":
        verdict.fixes += _signal_fixes(list(dict.fromkeys(want_stock)) + list(dict.fromkeys(want_enh)))
    elif want_enh:
        verdict.fixes += _signal_fixes(list(dict.fromkeys(want_enh)))
    if identity_fix:
        verdict.fixes.append(Fix("relabel", f"give every target a unique {snap.identity_label!r} label "
                                 "(snippet per scrape kind: the identity finding below)", ""))
    return verdict


def diagnose(snap: Snapshot, families: tuple[Family, ...] = FAMILIES, skip: Iterable[str] = ()) -> Report:
    """Judge ``snap``: a :class:`Report` with one verdict per family (``skip``: family names reported as
    ``skipped`` and left out of the exit code) and the fleet-level findings."""
    skip = set(skip)
    ctx = _context(snap, families)
    verdicts = []
    for fam in families:
        if fam.name in skip:
            verdicts.append(FamilyVerdict(fam.name, fam.alerts, fam.paging, "skipped", ["skipped (--skip)"],
                                          note=fam.note, runbook=fam.runbook))
        else:
            verdicts.append(judge_family(ctx, fam))
    findings = (_selector_findings(ctx) + _identity_findings(ctx) + _driver_findings(ctx) + _workload_findings(ctx)
                + _exporter_generation_findings(ctx))
    targets = {"dcgm": {"matched": len(snap.dcgm_targets), "up": sum(t.up for t in snap.dcgm_targets)},
               "vllm": {"matched": len(snap.vllm_targets), "up": sum(t.up for t in snap.vllm_targets)}}
    return Report(snap.url, snap.identity_label, {"dcgm": snap.dcgm_selector, "vllm": snap.vllm_selector}, targets,
                  verdicts, findings)
