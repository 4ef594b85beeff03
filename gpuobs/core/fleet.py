"""The fleet config: the one type every renderer and runtime user of fleet facts receives
(``prometheus/fleet.yaml``; ``--fleet FILE`` / ``GPUOBS_FLEET_CONFIG`` where a command takes another).

A monitoring mixin's ``_config``: the few facts about a fleet that the rules, the Alertmanager config's
grouping and inhibitions and the dashboards are rendered from (:mod:`gpuobs.mixin.render`), and that
the runtime users read instead of keeping defaults of their own (doctor, the canary's selectors, the
rollout's inventory and signals, compat's inventory, drills, reports) (docs/real-fleet.md):

* ``identity_label``: the node-identity label the scrape config guarantees on every DCGM, vLLM and
  gpuobs series (default ``node``; see README "Pointing it at a real fleet" for the relabelling).
  dcgm-exporter's own ``Hostname`` is NOT usable: it may be the node name, the exporter pod name,
  ``localhost``, lowercase ``hostname`` or absent (docs/real-fleet.md, step 3).
* ``selectors.dcgm`` / ``selectors.vllm``: PromQL label matchers that select the DCGM exporter's and
  the serving engines' targets (``job`` is the Service name under kube-prometheus ServiceMonitors,
  e.g. ``nvidia-dcgm-exporter``).
* ``paths``: per family, which signal paths the rules use: ``both`` (default: the enhanced signal
  when its series exist, else the stock one), ``stock`` or ``enhanced``.
* ``xid_kernel_log``: also page Xids from gpuobs logwatch's kernel-log counters inside
  GpuXidCritical/GpuXidWarning (off by default: the kernel-log rule file pages on them itself).
* ``gpu.slowdown_temp_c``: the temperature at which the GPU's thermal slowdown starts (H100 SXM: 87 C,
  the simulator's ``GpuModel.slowdown_temp_c``), used by the stock throttling path.
* ``runbook_base``: where runbook links point, ``<base>/runbooks/<file>.md#<alert>`` (the stack rewrites
  it at render time).
* ``dashboard_base``: the Grafana whose dashboards the alerts' ``dashboard_url`` links open,
  ``<base>/d/<uid>/<slug>?viewPanel=N``.

Errors: :class:`FleetConfigError` (an input error, exit 2) naming the field and the allowed values.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import urlsplit
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpuobs.core import assets
from gpuobs.core.errors import InputError, yaml_problem

#: Families whose rules have a stock and an enhanced path (gpuobs.mixin.families).
PATH_FAMILIES = ("xid", "gpu-missing", "ecc", "throttling", "collective-hang", "memory")
PATH_CHOICES = ("both", "stock", "enhanced")

#: The shipped fleet config, relative to the asset root (checkout or wheel).
SHIPPED_FLEET = "prometheus/fleet.yaml"
#: The default runbook base: the local pager, which serves runbooks/.
RUNBOOK_BASE = "http://127.0.0.1:9097"
#: The default dashboard base: the local Grafana (compose, or a native one on its default port).
DASHBOARD_BASE = "http://127.0.0.1:3000"
DEFAULT_DCGM_SELECTOR = 'job=~"dcgm|.*dcgm-exporter.*"'
DEFAULT_VLLM_SELECTOR = 'job=~"vllm|.*vllm.*"'

_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')


class FleetConfigError(InputError):
    """The fleet config is malformed; the message names the field and what is allowed."""


@dataclass(frozen=True)
class FleetConfig:
    """Parsed fleet config (see the module docstring). ``paths`` maps every PATH_FAMILIES name."""

    identity_label: str = "node"
    dcgm_selector: str = DEFAULT_DCGM_SELECTOR
    vllm_selector: str = DEFAULT_VLLM_SELECTOR
    paths: dict = field(default_factory=lambda: {f: "both" for f in PATH_FAMILIES})
    xid_kernel_log: bool = False
    slowdown_temp_c: float = 87.0
    runbook_base: str = RUNBOOK_BASE
    dashboard_base: str = DASHBOARD_BASE

    def stock(self, family: str) -> bool:
        return self.paths[family] in ("both", "stock")

    def enhanced(self, family: str) -> bool:
        return self.paths[family] in ("both", "enhanced")


def check_label_name(text: str, flag: str) -> str:
    """A Prometheus label name (``[a-zA-Z_][a-zA-Z0-9_]*``, not ``__``-prefixed) given for an identity
    label by ``flag``, or InputError naming ``flag``."""
    if not isinstance(text, str) or not _LABEL.fullmatch(text) or text.startswith("__"):
        raise InputError(f"{flag}: expected a Prometheus label name such as node, got {text!r}")
    return text


#: Labels the rules use for something other than the node: the target (``instance``, the identity of
#: the degraded alerts, gpuobs.mixin.gpu_rules.FALLBACK_IDENTITY; ``job``), the GPU (``gpu``, ``UUID``,
#: ``pci_bus_id``, ``modelName``, ``device``), the Xid (``xid``, ``err_code``), the pod and histograms.
RESERVED_LABELS = frozenset({"instance", "job", "gpu", "UUID", "pci_bus_id", "modelName", "device", "xid",
                             "err_code", "GPU_I_ID", "pod", "le", "identity_source"})


def parse_matchers(text: object, field: str) -> list[str]:
    """The label matchers of a target selector (``job="dcgm"``, ``job=~"a|b", namespace="gpu"`` or the
    same in braces), each normalised to ``name OP "value"``: the one grammar of the fleet config's
    selectors, doctor's and compat's selector flags. Raises FleetConfigError (an input error) naming
    ``field`` when it is not a non-empty list of matchers (OP one of ``=``, ``!=``, ``=~``, ``!~``; the
    value double-quoted) or when it matches on ``__name__`` (a selector picks targets, not metrics)."""
    body = text.strip() if isinstance(text, str) else ""
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    body = body.strip().rstrip(",")
    parts, pos = [], 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if not m:
            break
        if m.group(1) == "__name__":
            raise FleetConfigError(f"{field}: selects targets, not metrics; drop the __name__ matcher from {text!r}")
        parts.append(f'{m.group(1)}{m.group(2)}"{m.group(3)}"')
        pos = m.end()
        if pos < len(body):
            if body[pos] != ",":
                break
            pos += 1
    if not parts or pos < len(body):
        raise FleetConfigError(f'{field}: expected label matchers such as job="dcgm" or {{job=~"a|b",namespace="gpu"}} '
                               f'(operators =, !=, =~, !~; values in double quotes), got {text!r}')
    return parts


def _mapping(doc: dict, key: str, what: str) -> dict:
    """``doc[key]`` as a mapping (absent or null: empty); FleetConfigError naming ``key`` otherwise."""
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FleetConfigError(f"{key}: expected {what}; got {value!r}")
    return value


def _base_url(value: object, field: str, example: str) -> str:
    """An http(s) base URL with a host and no query, fragment, whitespace or template braces (links are
    ``<base>/<path>``: ``<runbook_base>/runbooks/<file>.md#<anchor>``, ``<dashboard_base>/d/<uid>/...``),
    without its trailing slash. Raises FleetConfigError naming ``field``."""
    try:
        parts = urlsplit(value) if isinstance(value, str) and not re.search(r"[\s{}]", value) else None
        host = parts.hostname if parts else None
        _ = parts.port if parts else None  # raises for a port out of range
    except ValueError:  # e.g. an unbalanced IPv6 bracket, port 99999
        parts = host = None
    if not (parts and parts.scheme in ("http", "https") and host and "?" not in value and "#" not in value):
        raise FleetConfigError(f"{field}: expected an http(s) URL with a host and no query, fragment, spaces "
                               f"or braces, e.g. {example}; got {value!r}")
    return value.rstrip("/")


def parse_fleet(doc: object, source: str = "fleet config") -> FleetConfig:
    """A FleetConfig from a parsed YAML document (an empty document is the default config; a field left
    out takes :class:`FleetConfig`'s default). Raises FleetConfigError naming the bad field."""
    default = FleetConfig()
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise FleetConfigError(f"{source}: expected a mapping with identity_label, selectors, paths, gpu")
    known = {"identity_label", "selectors", "paths", "xid_kernel_log", "gpu", "runbook_base", "dashboard_base"}
    unknown = set(doc) - known
    if unknown:
        raise FleetConfigError(f"{source}: unknown field(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(known))}")
    ident = doc.get("identity_label", default.identity_label)
    if not isinstance(ident, str) or not _LABEL.fullmatch(ident) or ident.startswith("__"):
        raise FleetConfigError(f"identity_label: expected a Prometheus label name like node; got {ident!r}")
    if ident in ("Hostname", "hostname"):
        raise FleetConfigError(f"identity_label: {ident!r} is dcgm-exporter's own host label, which may be a pod name, "
                               "'localhost' or absent; use a label the scrape config sets (e.g. node)")
    if ident in RESERVED_LABELS:
        raise FleetConfigError(f"identity_label: {ident!r} already means something else to the rules (one of "
                               f"{', '.join(sorted(RESERVED_LABELS))}: per target, per GPU or per Xid); name the "
                               "node with a label of its own that the scrape config sets (e.g. node)")
    sel = _mapping(doc, "selectors", "a mapping with keys dcgm and/or vllm")
    if set(sel) - {"dcgm", "vllm"}:
        raise FleetConfigError("selectors: expected a mapping with keys dcgm and/or vllm")
    paths = dict(default.paths)
    given = _mapping(doc, "paths", f"a mapping of family -> {'|'.join(PATH_CHOICES)}")
    for fam, choice in given.items():
        if fam not in PATH_FAMILIES:
            raise FleetConfigError(f"paths.{fam}: unknown family; allowed: {', '.join(PATH_FAMILIES)}")
        if choice not in PATH_CHOICES:
            raise FleetConfigError(f"paths.{fam}: expected one of {', '.join(PATH_CHOICES)}; got {choice!r}")
        paths[fam] = choice
    kl = doc.get("xid_kernel_log", default.xid_kernel_log)
    if not isinstance(kl, bool):
        raise FleetConfigError(f"xid_kernel_log: expected true or false; got {kl!r}")
    gpu = _mapping(doc, "gpu", "a mapping with key slowdown_temp_c")
    if set(gpu) - {"slowdown_temp_c"}:
        raise FleetConfigError("gpu: expected a mapping with key slowdown_temp_c")
    temp = gpu.get("slowdown_temp_c", default.slowdown_temp_c)
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or not 40 <= temp <= 120:
        raise FleetConfigError(f"gpu.slowdown_temp_c: expected degrees C between 40 and 120; got {temp!r}")
    return FleetConfig(identity_label=ident,
                       dcgm_selector=", ".join(parse_matchers(sel.get("dcgm", default.dcgm_selector), "selectors.dcgm")),
                       vllm_selector=", ".join(parse_matchers(sel.get("vllm", default.vllm_selector), "selectors.vllm")),
                       paths=paths, xid_kernel_log=kl, slowdown_temp_c=float(temp),
                       runbook_base=_base_url(doc.get("runbook_base", default.runbook_base), "runbook_base",
                                              "https://runbooks.example (links are <base>/runbooks/<file>.md)"),
                       dashboard_base=_base_url(doc.get("dashboard_base", default.dashboard_base), "dashboard_base",
                                                "https://grafana.example (links are <base>/d/<uid>/...)"))


def load_fleet(path: Path, flag: str = "--fleet") -> FleetConfig:
    """Read and parse a fleet config file; ``flag`` names where the path came from in errors (e.g.
    ``--fleet (or GPUOBS_FLEET_CONFIG)``). Raises FleetConfigError (unreadable or not UTF-8 text, bad
    YAML, bad field)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetConfigError(f"{flag} {path}: {exc.strerror}") from exc
    except UnicodeDecodeError:
        raise FleetConfigError(f"{flag} {path}: not a UTF-8 text file (expected YAML like prometheus/fleet.yaml)") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FleetConfigError(f"{flag} {path}: not valid YAML ({yaml_problem(exc)})") from exc
    try:
        return parse_fleet(doc, str(path))
    except FleetConfigError as exc:  # name the file (and where it came from) before the field
        message = str(exc)
        raise FleetConfigError(message if message.startswith(str(path)) else f"{flag} {path}: {message}") from None


@functools.lru_cache(maxsize=1)
def shipped_fleet() -> FleetConfig:
    """The shipped fleet config (``prometheus/fleet.yaml``), what the repository's generated files and the
    local stack use (its scrape config labels every target with this identity label); read once per
    process. Raises FleetConfigError if it was edited into an invalid one."""
    return load_fleet(assets.path(SHIPPED_FLEET))
