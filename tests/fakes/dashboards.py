"""Helpers for the dashboard tests: read the dashboards, pull metric names and labels out of PromQL,
and list what our exporter pages emit (rendered in-process, no server).

The PromQL reader is deliberately small: it finds vector selectors (metric name + label matchers) and
grouping label lists (``by``/``without``/``on``/``ignoring``/``group_left``/``group_right``), which is
all the tests need to say "this expression refers to metric M with labels L". It is not a validator:
tests/mixin/test_dashboards.py hands every expression to promtool for that.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = ROOT / "grafana" / "dashboards"
RULES_DIR = ROOT / "prometheus" / "rules"
PUBLIC_QUERIES = ROOT / "tests" / "data" / "public_dashboard_queries.json"

#: Labels Prometheus attaches at scrape time, per job (gpuobs/stack/render.py write_targets; the rollout
#: adds ``track``). The vLLM page has no host label of its own, so its targets carry ``Hostname``.
TARGET_LABELS = {"dcgm": {"job", "instance", "node"}, "vllm": {"job", "instance", "node", "Hostname"}}

# ---- dashboards -----------------------------------------------------------------------------------------


def load_dashboards() -> dict[str, dict]:
    """File name -> parsed dashboard JSON, for every grafana/dashboards/*.json."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def all_panels(dash: dict) -> list[dict]:
    """Every panel, including those nested in collapsed rows."""
    out = []
    for p in dash.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def panel_targets(dash: dict) -> list[tuple[dict, dict]]:
    """``(panel, target)`` for every query target of every (non-row) panel."""
    return [(p, t) for p in all_panels(dash) if p.get("type") != "row" for t in p.get("targets", [])]


def variables(dash: dict) -> list[dict]:
    return dash.get("templating", {}).get("list", [])


def variable_query(var: dict) -> str:
    """The query text of a query variable (Grafana stores it as a string or ``{"query": ...}``)."""
    q = var.get("query")
    return q.get("query", "") if isinstance(q, dict) else (q or "")


LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<sel>.+?)\s*,\s*)?(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$",
                          re.S)


def parse_label_values(query: str) -> tuple[str | None, str]:
    """``label_values(<selector>, <label>)`` or ``label_values(<label>)`` -> (selector or None, label)."""
    m = LABEL_VALUES.match(query)
    if not m:
        raise ValueError(f"not a label_values() query: {query!r}")
    return m.group("sel"), m.group("label")


def recording_rule_names() -> set[str]:
    import yaml

    names = set()
    for path in RULES_DIR.glob("*.yml"):
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            names.update(r["record"] for r in group.get("rules", []) if "record" in r)
    return names


# ---- PromQL references ----------------------------------------------------------------------------------
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<num>(?:0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?:ms|[smhdwy])?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){},@])
""", re.X)
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = GROUPING | {"bool", "and", "or", "unless", "offset", "inf", "nan", "Inf", "NaN", "atan2"}


@dataclass
class Selector:
    """A vector selector: metric name (None when only ``__name__`` regexes select) and its matchers."""

    name: str | None
    matchers: list[tuple[str, str, str]] = field(default_factory=list)  # (label, op, value)

    def label_names(self) -> set[str]:
        return {lbl for lbl, _, _ in self.matchers if lbl != "__name__"}


@dataclass
class Refs:
    selectors: list[Selector]
    grouping: set[str]  # label names in by/without/on/ignoring/group_left/group_right lists

    def metrics(self) -> set[str]:
        return {s.name for s in self.selectors if s.name}


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot tokenize PromQL at {expr[pos:pos + 20]!r} in {expr!r}")
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
        pos = m.end()
    return out


def _unquote(s: str) -> str:
    return json.loads(s) if s.startswith('"') else s[1:-1]


def _matchers(toks: list[tuple[str, str]], i: int) -> tuple[list[tuple[str, str, str]], int]:
    """Parse ``{l op "v", ...}`` starting at the ``{`` at ``i``; returns (matchers, index after ``}``)."""
    assert toks[i][1] == "{"
    i += 1
    out = []
    while toks[i][1] != "}":
        if toks[i][1] == ",":
            i += 1
            continue
        (_, label), (_, op), (kind, value) = toks[i], toks[i + 1], toks[i + 2]
        if kind != "str":
            raise ValueError(f"label matcher {label}{op} needs a string, got {value!r}")
        out.append((label, op, _unquote(value)))
        i += 3
    return out, i + 1


def promql_refs(expr: str) -> Refs:
    """Vector selectors and grouping labels of a PromQL expression (Grafana variables substituted first)."""
    toks = _tokens(expr)
    sels, grouping, i = [], set(), 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else None
        if kind == "ident" and text in GROUPING and nxt == "(":
            i += 2
            while toks[i][1] != ")":
                if toks[i][0] == "ident":
                    grouping.add(toks[i][1])
                i += 1
            i += 1
        elif kind == "ident" and (text in KEYWORDS or nxt in ("(", "by", "without")):
            i += 1  # operator keyword, function or aggregation (`sum by (x) (...)`)
        elif kind == "ident":
            sel = Selector(text)
            i += 1
            if nxt == "{":
                sel.matchers, i = _matchers(toks, i)
            sels.append(sel)
        elif text == "{":
            matchers, i = _matchers(toks, i)
            names = [v for lbl, op, v in matchers if lbl == "__name__" and op == "="]
            sels.append(Selector(names[0] if names else None, matchers))
        else:
            i += 1
    return Refs(sels, grouping)


# ---- what our exporter emits ------------------------------------------------------------------------------
def exporter_inventory() -> dict[str, dict[str, set[str]]]:
    """``{job: {sample name: label names}}`` of the pages our exporter serves, rendered in-process.

    Covers a serving node (DCGM page with a GPU in MIG mode and one with an Xid in its window, and the
    vLLM engine page) and a training node; label names include the job's scrape-time target labels.
    """
    from gpuobs.exporter.collectors.dcgm import DcgmCollector
    from gpuobs.exporter.collectors.vllm import EngineCollector
    from gpuobs.exporter.exposition import render
    from gpuobs.exporter.sim.faults import validate
    from gpuobs.exporter.sim.gpu import H100_SXM
    from gpuobs.exporter.sim.mig import parse_mig_spec
    from gpuobs.exporter.sim.node import Node, NodeConfig

    serving = Node(NodeConfig(index=0, gpus=2, seed=11))
    training = Node(NodeConfig(index=1, gpus=2, seed=11, role="training"))
    # MIG on a product whose instances report FB_* (A100; H100 instances do not, dcgm-exporter #512, #380)
    a100 = dataclasses.replace(H100_SXM, name="NVIDIA A100-SXM4-80GB", mig_instance_fb=True)
    mig_node = Node(NodeConfig(index=2, gpus=2, seed=11, model=a100))
    serving.inject(validate({"kind": "xid", "gpu": 1, "code": 13}, 2))
    for n in (serving, training, mig_node):
        for _ in range(5):
            n.advance(1.0)
    # Today's dashboards read enhanced fields (SM_ACTIVE, clock events, Xid counts, allocator): the
    # recommended exporter profile serves them.
    pages = {"dcgm": [render(DcgmCollector(serving, profile="recommended").collect()),
                      render(DcgmCollector(mig_node, mig=parse_mig_spec("0=1g.10gb", 2), profile="recommended").collect()),
                      render(DcgmCollector(training, profile="recommended").collect())],
             "vllm": [render(EngineCollector(serving).collect())]}
    inv: dict[str, dict[str, set[str]]] = {}
    for job, texts in pages.items():
        names: dict[str, set[str]] = {}
        for text in texts:
            for name, labels in parse_exposition(text):
                names.setdefault(name, set()).update(labels)
        inv[job] = {n: labels | TARGET_LABELS[job] for n, labels in names.items()}
    return inv


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


def parse_exposition(text: str) -> list[tuple[str, set[str]]]:
    """``(sample name, label names)`` of every sample line, names exactly as Prometheus stores them
    (prometheus_client's parser would append ``_total`` to dcgm-exporter's counters, Prometheus does not)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"unparsable sample line: {line!r}")
        out.append((m.group(1), set(_LABEL.findall(m.group(2) or ""))))
    return out


def emitted_labels(inv: dict[str, dict[str, set[str]]]) -> dict[str, set[str]]:
    """Sample name -> label names, across jobs."""
    out: dict[str, set[str]] = {}
    for names in inv.values():
        for n, labels in names.items():
            out.setdefault(n, set()).update(labels)
    return out


# ---- public dashboards ----------------------------------------------------------------------------------
def load_public() -> list[dict]:
    return json.loads(PUBLIC_QUERIES.read_text())["sources"]


#: Metrics public dashboards use that our exporter does not emit ON PURPOSE: names vLLM removed in its V1
#: engine (design section 4.3: "gone upstream; do not emit them"). Their V1 replacements are emitted.
DELIBERATELY_ABSENT = {
    "vllm:gpu_cache_usage_perc": "vLLM V0 name, removed upstream; V1 emits vllm:kv_cache_usage_perc (we do)",
    "vllm:time_per_output_token_seconds": "vLLM V0 name, removed upstream; V1 emits "
                                          "vllm:inter_token_latency_seconds and "
                                          "vllm:request_time_per_output_token_seconds (we do)",
}
#: vLLM V1 metrics (vllm/v1/metrics/loggers.py) that vLLM's own example dashboard charts but the
#: simulated engine (gpuobs/exporter/sim/engine.py) does not emit yet: those panels stay empty against it.
#: None since the per-request histograms (prompt/generation length, prefill/decode time, max generation
#: tokens) joined the engine page; a new upstream panel on a series we lack would be listed here.
NOT_YET_EMITTED: dict[str, str] = {}
#: Grouping labels public dashboards name that no dcgm-exporter series carries; grouping by an absent
#: label is a no-op in PromQL, so the panel still works.
NOOP_GROUPING = {"uuid": "dcgm-exporter's label is UUID; `by (..., uuid)` in NVIDIA's dashboard is a harmless no-op"}


def histogram_base(sample_name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name
