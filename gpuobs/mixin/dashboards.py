"""Generate gpuobs's Grafana dashboards (grafana/dashboards/*.json) from the definitions below.

Standard library only: Grafana is not installed everywhere gpuobs runs and grafana-foundation-sdk is
not installable offline, so the JSON is built from plain dicts. The generated files are committed (the
compose stack and a real Grafana provision them as they are); tests/mixin/test_dashboards.py fails when
a committed file differs from what this script writes, so edit this script, then run

    gpuobs rules dashboards            # rewrite grafana/dashboards/*.json
    gpuobs rules dashboards --check    # exit 1 if a committed file is stale

Conventions every dashboard follows (and the tests check): datasource ``${datasource}`` (a variable of
type prometheus whose default is the provisioned uid ``prometheus``); a unit on every panel; panel ids
that alert annotations link to (``dashboard_url`` ... ``?viewPanel=N`` in prometheus/rules/*.yml) are
fixed here, never renumbered; metric names are dcgm-exporter's and vLLM V1's (design section 4) or the
recording rules in prometheus/rules/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from gpuobs.core import assets
from gpuobs.core.files import stale_files, write_tree
from gpuobs.reference.dcgm_exporter import THROTTLE_BITS

if TYPE_CHECKING:
    from gpuobs.core.fleet import FleetConfig

SCHEMA_VERSION = 39  # Grafana 11.0's dashboard schema; newer Grafanas (compose pins 11.6) migrate it on load
DS = {"type": "prometheus", "uid": "${datasource}"}

# Label selectors shared by the panels (Grafana renders a multi-value variable as a regex alternation).
# Placeholders replaced at render time (render_all): __ID__ by the fleet's identity label (prometheus/fleet.yaml,
# `node` by default), __DCGM__/__VLLM__ by its DCGM and vLLM target selectors.
ID, DCGM, VLLM = "__ID__", "__DCGM__", "__VLLM__"
GPU_SEL = '__ID__=~"$__ID__", gpu=~"$gpu"'
HOST_SEL = '__ID__=~"$__ID__"'
#: The same through the DCGM selector (GPU fleet dashboard's raw DCGM series; recording rules keep only the
#: GPU's identity labels, so panels over them use GPU_SEL/HOST_SEL).
DGPU_SEL = '__DCGM__, __ID__=~"$__ID__", gpu=~"$gpu"'
DHOST_SEL = '__DCGM__, __ID__=~"$__ID__"'
VLLM_SEL = '__VLLM__, model_name=~"$model_name", __ID__=~"$__ID__"'
TRACK_SEL = 'track=~"canary|baseline"'

#: The SLO rule windows (prometheus/rules/slo.yml, generated from prometheus/slo.yaml for a 30d period).
BURN_WINDOWS = ["5m", "30m", "1h", "6h", "3d"]


# ---- building blocks ------------------------------------------------------------------------------------
def target(expr: str, legend: str = "", ref: str = "A", *, table: bool = False) -> dict:
    """A Prometheus query of a panel: a range query, or an instant query in table format."""
    t = {"datasource": DS, "refId": ref, "editorMode": "code", "expr": expr, "legendFormat": legend}
    if table:
        t.update({"instant": True, "range": False, "format": "table"})
    else:
        t.update({"instant": False, "range": True})
    return t


def targets(*specs: tuple[str, str]) -> list[dict]:
    """Targets from ``(expr, legend)`` pairs with refIds A, B, C, ..."""
    return [target(e, leg, chr(ord("A") + i)) for i, (e, leg) in enumerate(specs)]


def thresholds(*steps: tuple[float, str]) -> dict:
    return {"mode": "absolute",
            "steps": [{"color": "green", "value": None}] + [{"color": c, "value": v} for v, c in steps]}


def override(ref: str, unit: str, axis: str = "right") -> dict:
    """Give the series of one query (by refId) its own unit on its own axis."""
    return {"matcher": {"id": "byFrameRefID", "options": ref},
            "properties": [{"id": "unit", "value": unit}, {"id": "custom.axisPlacement", "value": axis}]}


def panel(pid: int, title: str, unit: str, tgts: list[dict], *, kind: str = "timeseries", w: int = 12,
          h: int = 8, description: str = "", minv: float | None = None, maxv: float | None = None,
          steps: dict | None = None, overrides: list[dict] | None = None, draw: str = "line",
          decimals: int | None = None) -> dict:
    """One panel. ``gridPos`` x/y are filled in by :func:`layout`."""
    defaults: dict = {"unit": unit}
    if minv is not None:
        defaults["min"] = minv
    if maxv is not None:
        defaults["max"] = maxv
    if decimals is not None:
        defaults["decimals"] = decimals
    defaults["thresholds"] = steps or thresholds()
    options: dict
    if kind == "timeseries":
        defaults["custom"] = {"drawStyle": draw, "lineWidth": 1, "fillOpacity": 10 if draw == "line" else 80,
                              "showPoints": "never", "spanNulls": False,
                              "thresholdsStyle": {"mode": "line" if steps else "off"}}
        options = {"legend": {"displayMode": "table", "placement": "right", "showLegend": True,
                              "calcs": ["lastNotNull", "max"]},
                   "tooltip": {"mode": "multi", "sort": "desc"}}
    elif kind == "stat":
        defaults["color"] = {"mode": "thresholds"}
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "background", "graphMode": "none", "textMode": "value_and_name",
                   "orientation": "auto", "justifyMode": "auto"}
    elif kind == "table":
        options = {"showHeader": True, "cellHeight": "sm"}
    else:
        raise ValueError(f"unknown panel kind {kind!r}")
    p = {"id": pid, "type": kind, "title": title, "description": description, "datasource": DS,
         "gridPos": {"h": h, "w": w, "x": 0, "y": 0},
         "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
         "options": options, "targets": tgts}
    if kind == "table":
        # One row per series: the instant queries are merged on their common labels.
        p["transformations"] = [{"id": "merge", "options": {}},
                                {"id": "organize", "options": {"excludeByName": {"Time": True}}}]
    return p


def layout(panels: list[dict]) -> list[dict]:
    """Place panels left to right, wrapping at Grafana's 24-column width."""
    x = y = row_h = 0
    for p in panels:
        g = p["gridPos"]
        if x + g["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        g["x"], g["y"] = x, y
        x += g["w"]
        row_h = max(row_h, g["h"])
    return panels


def datasource_var() -> dict:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {"selected": False, "text": "Prometheus", "value": "prometheus"},
            "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1, "regex": ""}


def query_var(name: str, query: str, label: str | None = None) -> dict:
    """A multi-value ``label_values`` variable with an All option matching every value."""
    return {"name": name, "label": label or name, "type": "query", "datasource": DS,
            "definition": query,
            "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2, "includeAll": True, "allValue": ".*", "multi": True,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "hide": 0, "options": [], "regex": "", "sort": 1}


BUILTIN_ANNOTATION = {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
                      "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
                      "type": "dashboard"}


def dashboard(uid: str, title: str, description: str, variables: list[dict], panels: list[dict],
              annotations: list[dict] | None = None, time_from: str = "now-1h") -> dict:
    return {
        "id": None, "uid": uid, "title": title, "description": description,
        "tags": ["gpuobs"], "editable": False, "graphTooltip": 1, "liveNow": False,
        "refresh": "30s", "schemaVersion": SCHEMA_VERSION, "version": 1, "timezone": "browser",
        "time": {"from": time_from, "to": "now"}, "timepicker": {}, "fiscalYearStartMonth": 0, "weekStart": "",
        "links": [{"type": "dashboards", "tags": ["gpuobs"], "asDropdown": True, "title": "gpuobs dashboards",
                   "includeVars": False, "keepTime": True}],
        "annotations": {"list": [BUILTIN_ANNOTATION] + (annotations or [])},
        "templating": {"list": variables},
        "panels": layout(panels),
    }


def quantiles(metric: str, sel: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.9, 0.99),
              legend_prefix: str = "") -> list[tuple[str, str]]:
    """``histogram_quantile`` of a histogram for each quantile, summed ``by (<by>, le)``."""
    grouping = f"{by}, le" if by else "le"
    return [(f"histogram_quantile({q}, sum by ({grouping}) (rate({metric}_bucket{{{sel}}}[$__rate_interval])))",
             f"{legend_prefix}p{round(q * 100)}") for q in qs]


# ---- GPU fleet ------------------------------------------------------------------------------------------
def fleet() -> dict:
    reporting = f"count by (__ID__) (count by (__ID__, gpu) (DCGM_FI_DEV_GPU_TEMP{{{DHOST_SEL}}}))"
    expected = f"gpuobs_node_expected_gpus{{{HOST_SEL}}}"
    bit_targets = [(f"sum by (__ID__) (floor(DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{DGPU_SEL}}} / {bit}) % 2)",
                    f"{{{{__ID__}}}} {name}") for name, bit in THROTTLE_BITS]
    clock = f"DCGM_FI_DEV_SM_CLOCK{{{DGPU_SEL}}}"
    throttle = targets(*bit_targets, (f"gpu:dcgm_throttled_time:ratio_rate2m{{{GPU_SEL}}}",
                                      "{{__ID__}} GPU {{gpu}} time throttled (thermal+power counters)"),
                       (f"max by (__ID__, gpu) ({clock}) / max by (__ID__, gpu) (max_over_time({clock}[1h]))",
                        "{{__ID__}} GPU {{gpu}} SM clock / its 1h max (stock)"))
    throttled_ref, clock_ref = throttle[-2]["refId"], throttle[-1]["refId"]
    ever = f"count by (__ID__) (count by (__ID__, gpu) (last_over_time(DCGM_FI_DEV_GPU_TEMP{{{DHOST_SEL}}}[1h])))"
    health = [
        target(f"count by (__ID__, modelName, DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP{{{DHOST_SEL}}})",
               "GPUs reporting", "A", table=True),
        target(f"max by (__ID__) ({expected})", "GPUs expected", "B", table=True),
        target(f"max by (__ID__) (DCGM_FI_DEV_XID_ERRORS{{{DHOST_SEL}}})", "last Xid", "C", table=True),
        target(f"sum by (__ID__) (gpu:dcgm_clocks_event_thermal_or_power:bool{{{HOST_SEL}}})",
               "GPUs throttled now", "D", table=True),
        target(f"max by (__ID__) (DCGM_FI_DEV_GPU_TEMP{{{DHOST_SEL}}})", "hottest GPU", "E", table=True),
    ]
    panels = [
        panel(1, "Driver and health by node", "none", health, kind="table", w=12, h=8,
              description="One row per node and driver version: GPUs reporting vs expected, the last Xid any "
                          "of its GPUs reported (0 = none since driver load; DCGM keeps the last value "
                          "forever, see the Xid panel for recent ones), GPUs with a thermal/power clock-event "
                          "bit set now (needs the clock-event field, recommended.csv), and the hottest GPU. Two "
                          "driver versions for one GPU model is driver skew (GpuDriverSkew; the dcgm-exporter "
                          "Helm chart's counters drop the DCGM_FI_DRIVER_VERSION label: empty there).",
              overrides=[{"matcher": {"id": "byFrameRefID", "options": "E"},
                          "properties": [{"id": "unit", "value": "celsius"}]}]),
        panel(2, "Missing GPUs", "none",
              targets((f"({expected} - on (__ID__) ({reporting} or on (__ID__) (0 * {expected})))"
                       f" or on (__ID__) ({ever} - on (__ID__) {reporting})", "{{__ID__}}")),
              kind="stat", w=6, h=8, steps=thresholds((1, "red")),
              description="GPUs a node should have (gpuobs_node_expected_gpus, where a gpuobs agent publishes "
                          "it) minus GPUs on its DCGM page; on a stock exporter, GPUs that reported within the "
                          "last hour minus GPUs reporting now. A GPU that fell off the bus (Xid 79) vanishes "
                          "from the page; anything above 0 pages (GpuMissing)."),
        panel(10, "DCGM exporters up", "none",
              targets(('sum(up{__DCGM__, __ID__=~"$__ID__"})', "up"),
                      ('count(up{__DCGM__, __ID__=~"$__ID__"})', "targets")),
              kind="stat", w=3, h=8,
              description="DCGM exporter targets (the fleet config's DCGM selector) answering / configured "
                          "(GpuExporterDown). A target without the identity label is not counted here: "
                          "GpuTelemetryWithoutIdentity tickets it."),
        panel(11, "Driver versions per GPU model", "none",
              targets((f"count by (modelName) (count by (modelName, DCGM_FI_DRIVER_VERSION) "
                       f"(DCGM_FI_DEV_GPU_TEMP{{{DHOST_SEL}}}))", "{{modelName}}")),
              kind="stat", w=3, h=8, steps=thresholds((2, "orange")),
              description="Distinct NVIDIA driver versions per GPU pool: more than 1 is driver skew."),
        panel(3, "Xid errors by code", "none",
              targets((f"sum by (xid) (max_over_time(DCGM_EXP_XID_ERRORS_COUNT{{{DGPU_SEL}}}[$__interval]))",
                       "Xid {{xid}}"),
                      (f"count by (err_code) (DCGM_FI_DEV_XID_ERRORS{{{DGPU_SEL}}})",
                       "GPUs whose last Xid is {{err_code}} (stock gauge)")),
              w=24, h=7, draw="bars", decimals=0,
              description="Xids per code within the exporter's sliding window (DCGM_EXP_XID_ERRORS_COUNT: "
                          "commented out in dcgm-exporter's default counters, enabled by "
                          "deploy/dcgm-exporter/recommended.csv). On a stock exporter only the second query has "
                          "data: GPUs per LAST Xid code (the gauge holds it until the exporter restarts; a bar "
                          "that appears is a new Xid). Empty in a healthy fleet. Filter __ID__/gpu to find the "
                          "GPU; the code's NVIDIA action is in runbooks/xid.md."),
        panel(6, "Throttling by reason (clock-event bits)", "none", throttle, w=12, h=9,
              overrides=[override(throttled_ref, "percentunit"), override(clock_ref, "percentunit")],
              description="GPUs per node with each thermal/power bit of DCGM_FI_DEV_CLOCKS_EVENT_REASONS set "
                          "(SW_POWER_CAP 0x4, HW_SLOWDOWN 0x8, SW_THERMAL 0x20, HW_THERMAL 0x40, "
                          "HW_POWER_BRAKE 0x80), and on the right axis the fraction of time each GPU was "
                          "clock-limited from the violation counters. Both need fields outside dcgm-exporter's "
                          "default counters (recommended.csv; the bitmask may be named "
                          "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, which GPUThrottling also reads). On a stock "
                          "exporter the last query has data: the SM clock as a fraction of its 1h maximum "
                          "(GPUThrottling's stock path: under 85 % while busy and hot or power-collapsed)."),
        panel(7, "ECC errors and row remapping", "none",
              targets((f"max by (__ID__, gpu) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{DGPU_SEL}}})",
                       "{{__ID__}} GPU {{gpu}} DBE (volatile)"),
                      (f"max by (__ID__, gpu) (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{DGPU_SEL}}})",
                       "{{__ID__}} GPU {{gpu}} SBE (volatile)"),
                      (f"max by (__ID__, gpu) (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{DGPU_SEL}}})",
                       "{{__ID__}} GPU {{gpu}} rows remapped (uncorrectable)"),
                      (f"max by (__ID__, gpu) (DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{DGPU_SEL}}})",
                       "{{__ID__}} GPU {{gpu}} rows remapped (correctable)"),
                      (f"max by (__ID__, gpu) (DCGM_FI_DEV_ROW_REMAP_FAILURE{{{DGPU_SEL}}})",
                       "{{__ID__}} GPU {{gpu}} row remap FAILED")),
              w=12, h=9, decimals=0,
              description="Double-bit (uncorrectable) ECC errors page (GpuEccDoubleBitError); a remap recorded "
                          "for one activates at the next GPU reset (GpuRowRemapPending); a failed remap means "
                          "RMA (GpuRowRemapFailure). Volatile counters reset at driver load. DBE/SBE counters are "
                          "commented out in dcgm-exporter's default counters (recommended.csv enables them); on a "
                          "stock exporter the remapped-row counters and the remap failure flag are the signal."),
        panel(4, "GPU and memory temperature", "celsius",
              targets((f"max by (__ID__, gpu) (DCGM_FI_DEV_GPU_TEMP{{{DGPU_SEL}}})", "{{__ID__}} GPU {{gpu}}"),
                      (f"max by (__ID__, gpu) (DCGM_FI_DEV_MEMORY_TEMP{{{DGPU_SEL}}})",
                       "{{__ID__}} GPU {{gpu}} HBM")),
              description="Temperature alone is not an alert: a hot GPU that keeps its clocks is fine. "
                          "Look at the throttling panel."),
        panel(5, "Power draw", "watt",
              targets((f"max by (__ID__, gpu) (DCGM_FI_DEV_POWER_USAGE{{{DGPU_SEL}}})", "{{__ID__}} GPU {{gpu}}")),
              description="Per GPU (MIG instances repeat their parent's power; max folds them)."),
        panel(8, "GPU utilisation vs SM active (why util % lies)", "percentunit",
              targets((f"avg by (__ID__, gpu) (DCGM_FI_DEV_GPU_UTIL{{{DGPU_SEL}}}) / 100",
                       "{{__ID__}} GPU {{gpu}} GPU_UTIL (a kernel was resident)"),
                      (f"avg by (__ID__, gpu) (DCGM_FI_PROF_SM_ACTIVE{{{DGPU_SEL}}})",
                       "{{__ID__}} GPU {{gpu}} SM active (SMs with work)"),
                      (f"avg by (__ID__, gpu) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{DGPU_SEL}}})",
                       "{{__ID__}} GPU {{gpu}} tensor pipe active")),
              w=12, h=9, minv=0, maxv=1,
              description="DCGM_FI_DEV_GPU_UTIL (what nvidia-smi shows) is the fraction of time ANY kernel was "
                          "running, however few SMs it used: a single-SM kernel, or an NCCL kernel spinning in "
                          "a hung collective, reads ~100 %. SM active (DCGM_FI_PROF_SM_ACTIVE) is the fraction "
                          "of SM cycles with a warp resident, and tensor-pipe active the fraction doing matrix "
                          "math. A wide gap between the first and the other two is the lie. SM active is commented "
                          "out in every shipped counters CSV (recommended.csv enables it); on a stock exporter "
                          "GPU_UTIL against tensor-pipe activity shows the same gap."),
        panel(12, "SM clock", "hertz",
              targets((f"max by (__ID__, gpu) (DCGM_FI_DEV_SM_CLOCK{{{DGPU_SEL}}}) * 1e6", "{{__ID__}} GPU {{gpu}}")),
              w=12, h=9, description="DCGM_FI_DEV_SM_CLOCK (MHz) in Hz. A drop under load is throttling."),
        panel(13, "NVLink and PCIe errors", "cps",
              targets((f"sum by (__ID__, gpu) (rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{DGPU_SEL}}}"
                       f"[$__rate_interval]))", "{{__ID__}} GPU {{gpu}} NVLink CRC flit"),
                      (f"sum by (__ID__, gpu) (rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{DGPU_SEL}}}[$__rate_interval]))",
                       "{{__ID__}} GPU {{gpu}} PCIe replay")),
              w=24, h=7, description="Link errors per second (GpuNvlinkErrors, GpuPcieReplays). The NVLink error "
                                    "counters are commented out in every shipped counters CSV: on a stock exporter "
                                    "NVLink degradation is invisible (enable them with recommended.csv); PCIe "
                                    "replays are in the default set."),
    ]
    variables = [datasource_var(),
                 query_var("__ID__", "label_values(DCGM_FI_DEV_GPU_TEMP, __ID__)"),
                 query_var("gpu", 'label_values(DCGM_FI_DEV_GPU_TEMP{__ID__=~"$__ID__"}, gpu)')]
    return dashboard("gpuobs-fleet", "GPU Fleet",
                     "GPU health across the fleet from dcgm-exporter metrics: missing GPUs, Xids, throttling, "
                     "ECC, temperature, power, and why GPU utilisation misleads.", variables, panels)


# ---- Serving SLOs ---------------------------------------------------------------------------------------
def serving() -> dict:
    success = f"vllm:request_success_total{{{VLLM_SEL}"
    burn = targets(*[(f'slo:burn_rate:ratio_rate{w}{{model_name=~"$model_name"}}', f"{{{{slo}}}} {w}")
                     for w in BURN_WINDOWS])
    kv = targets((f"vllm:kv_cache_usage_perc{{{VLLM_SEL}}}", "{{__ID__}} KV-cache usage"),
                 (f"rate(vllm:num_preemptions_total{{{VLLM_SEL}}}[$__rate_interval])", "{{__ID__}} preemptions/s"))
    panels = [
        panel(1, "Time to first token", "s",
              targets(*quantiles("vllm:time_to_first_token_seconds", VLLM_SEL)), steps=thresholds((2.5, "red")),
              description="Quantiles over the selected engines from vLLM's histogram. The TTFT SLO: 99.9 % of "
                          "requests get their first token within 2.5 s (prometheus/slo.yaml)."),
        panel(2, "Inter-token latency", "s", targets(*quantiles("vllm:inter_token_latency_seconds", VLLM_SEL)),
              description="Time between consecutive output tokens (vllm:inter_token_latency_seconds)."),
        panel(3, "End-to-end request latency", "s",
              targets(*quantiles("vllm:e2e_request_latency_seconds", VLLM_SEL)),
              description="Arrival to last token, queueing included."),
        panel(4, "Goodput vs finished requests", "reqps",
              targets(('model_name:vllm_goodput_requests:rate5m{model_name=~"$model_name"}',
                       "{{model_name}} goodput (TTFT <= 2.5 s, TPOT <= 100 ms)"),
                      (f"sum by (model_name) (rate({success}}}[$__rate_interval]))", "{{model_name}} finished")),
              description="Requests per second that met both latency targets (recording rule "
                          "model_name:vllm_goodput_requests:rate5m, whole fleet) against all finished requests "
                          "of the selected engines."),
        panel(5, "Error ratio", "percentunit",
              targets((f'sum by (model_name) (rate({success}, finished_reason="error"}}[$__rate_interval])) / '
                       f"sum by (model_name) (rate({success}}}[$__rate_interval]))", "{{model_name}}"),
                      ('__ID__:vllm_request_errors:ratio_rate5m{__ID__=~"$__ID__"}', "{{__ID__}} (5m)")),
              description="Requests finished with finished_reason=error over all finished requests. The "
                          "availability SLO allows 0.1 %."),
        panel(6, "Error budget remaining (30d)", "percentunit",
              targets(('slo:error_budget_remaining:ratio{model_name=~"$model_name"}', "{{model_name}} {{slo}}")),
              kind="stat", w=12, steps={"mode": "absolute", "steps": [{"color": "red", "value": None},
                                                                      {"color": "orange", "value": 0.25},
                                                                      {"color": "green", "value": 0.5}]},
              description="1 - (SLI error ratio over the SLO period / error budget). Below 0 the SLO is broken; "
                          "the release gate refuses new rollouts while the budget is spent."),
        panel(7, "Burn rate per window", "suffix:x", burn, w=12, steps=thresholds((6, "orange"), (14.4, "red")),
              description="Error-budget burn rate (SLI error ratio / budget) per window. Pages: 1h and 5m "
                          "above 14.4x, or 6h and 30m above 6x; ticket: 3d and 6h above 1x "
                          "(ServingErrorBudgetBurn, Google SRE Workbook multi-window multi-burn-rate)."),
        panel(8, "KV-cache usage", "percentunit", kv, minv=0, maxv=1, steps=thresholds((0.95, "red")),
              overrides=[override("B", "cps")],
              description="vllm:kv_cache_usage_perc is a ratio 0..1 despite its name. Near 1 the scheduler "
                          "preempts running requests (right axis) and queues new ones "
                          "(ServingKVCachePressure)."),
        panel(9, "Scheduler queue", "none",
              targets((f"sum by (__ID__) (vllm:num_requests_waiting{{{VLLM_SEL}}})", "{{__ID__}} waiting"),
                      (f"sum by (__ID__) (vllm:num_requests_running{{{VLLM_SEL}}})", "{{__ID__}} running")),
              description="Requests waiting for admission vs in the running batch."),
        panel(10, "Queue time", "s",
              targets(*quantiles("vllm:request_queue_time_seconds", VLLM_SEL, qs=(0.5, 0.99))),
              description="Time requests spent WAITING before the scheduler admitted them."),
        panel(11, "Token throughput", "suffix: tok/s",
              targets((f"sum by (__ID__) (rate(vllm:prompt_tokens_total{{{VLLM_SEL}}}[$__rate_interval]))",
                       "{{__ID__}} prompt"),
                      (f"sum by (__ID__) (rate(vllm:generation_tokens_total{{{VLLM_SEL}}}[$__rate_interval]))",
                       "{{__ID__}} generated")),
              description="Prefill and decode tokens per second."),
        panel(12, "GPU energy per generated token", "joule",
              targets(('__ID__:vllm_energy_per_generated_token:joules_rate5m{__ID__=~"$__ID__"}', "{{__ID__}}")),
              description="Node GPU power (W = J/s) over generated tokens per second (recording rule "
                          "__ID__:vllm_energy_per_generated_token:joules_rate5m). Rises when clocks throttle or "
                          "batching gets worse."),
    ]
    variables = [datasource_var(),
                 query_var("model_name", "label_values(vllm:num_requests_running, model_name)"),
                 query_var("__ID__", 'label_values(vllm:num_requests_running{model_name=~"$model_name"}, __ID__)')]
    return dashboard("gpuobs-serving", "Serving SLOs",
                     "vLLM V1 serving: latency quantiles, goodput, errors, SLO error budget and burn rates, "
                     "KV cache and queue.", variables, panels)


# ---- Memory ---------------------------------------------------------------------------------------------
def memory() -> dict:
    panels = [
        panel(1, "Allocator reserved vs allocated per GPU", "bytes",
              targets((f"pytorch_cuda_memory_reserved_bytes{{{GPU_SEL}}}", "{{__ID__}} GPU {{gpu}} reserved"),
                      (f"pytorch_cuda_memory_allocated_bytes{{{GPU_SEL}}}", "{{__ID__}} GPU {{gpu}} allocated")),
              description="The framework's caching allocator (torch.cuda.memory_stats): allocated = live "
                          "tensors; reserved = allocated + the allocator's cache. DCGM's FB_USED only sees "
                          "reserved (plus the CUDA context), never what is actually in use."),
        panel(2, "Fragmentation gap (reserved - allocated)", "bytes",
              targets((f"gpu:pytorch_cuda_fragmentation:bytes{{{GPU_SEL}}}", "{{__ID__}} GPU {{gpu}} gap"),
                      (f"pytorch_cuda_memory_inactive_split_bytes{{{GPU_SEL}}}",
                       "{{__ID__}} GPU {{gpu}} inactive split blocks"),
                      (f"gpu:pytorch_cuda_fragmentation:deriv10m{{{GPU_SEL}}}",
                       "{{__ID__}} GPU {{gpu}} gap growth")),
              overrides=[override("C", "Bps")],
              description="The gap growing while allocated stays flat is fragmentation: the cache fills with "
                          "split blocks no request fits, until cudaMalloc fails (KVFragmentationRisk). Right "
                          "axis: the gap's growth over 10 minutes."),
        panel(3, "Predicted time to OOM", "s",
              targets((f"gpu:pytorch_cuda_time_to_oom:seconds{{{GPU_SEL}}}", "{{__ID__}} GPU {{gpu}}")),
              steps={"mode": "absolute", "steps": [{"color": "red", "value": None},
                                                   {"color": "orange", "value": 14400},
                                                   {"color": "green", "value": 86400}]},
              description="Seconds until reserved memory reaches the framebuffer at the last 30 minutes' "
                          "trend. Absent while reserved is not growing (a healthy GPU has no OOM date)."),
        panel(4, "Allocator retries and OOMs", "none",
              targets((f"increase(pytorch_cuda_alloc_retries_total{{{GPU_SEL}}}[$__rate_interval])",
                       "{{__ID__}} GPU {{gpu}} alloc retries"),
                      (f"increase(pytorch_cuda_ooms_total{{{GPU_SEL}}}[$__rate_interval])",
                       "{{__ID__}} GPU {{gpu}} OOMs")),
              decimals=0,
              description="cudaMalloc retries (the allocator freed its cache and tried again: the last step "
                          "before OOM) and OOMs raised, per rate interval (GpuFrameworkOom)."),
        panel(5, "Framebuffer used vs total (DCGM)", "bytes",
              targets((f"sum by (__ID__, gpu) (DCGM_FI_DEV_FB_USED{{{GPU_SEL}}}) * 1048576",
                       "{{__ID__}} GPU {{gpu}} used"),
                      (f"sum by (__ID__, gpu) (DCGM_FI_DEV_FB_USED{{{GPU_SEL}}} + DCGM_FI_DEV_FB_FREE{{{GPU_SEL}}})"
                       " * 1048576", "{{__ID__}} GPU {{gpu}} usable")),
              description="DCGM's view (MiB, shown in bytes): used includes the allocator's whole reserve, so a "
                          "fragmented cache looks like a full GPU here."),
        panel(6, "Allocated memory trend", "Bps",
              targets((f"gpu:pytorch_cuda_memory_allocated:deriv10m{{{GPU_SEL}}}", "{{__ID__}} GPU {{gpu}}")),
              description="Growth of allocated memory over 10 minutes: a leak grows allocated; fragmentation "
                          "grows only the gap."),
    ]
    variables = [datasource_var(),
                 query_var("__ID__", "label_values(pytorch_cuda_memory_reserved_bytes, __ID__)"),
                 query_var("gpu", 'label_values(pytorch_cuda_memory_reserved_bytes{__ID__=~"$__ID__"}, gpu)')]
    return dashboard("gpuobs-memory", "GPU Memory",
                     "The framework caching allocator per GPU (needs the framework's allocator metrics, design "
                     "section 4.2; without them only the DCGM framebuffer panel has data): reserved vs allocated, "
                     "fragmentation, and the "
                     "projected out-of-memory.", variables, panels)


# ---- Training -------------------------------------------------------------------------------------------
def training() -> dict:
    on_training = "and on (__ID__) count by (__ID__) (training_mfu_ratio)"
    rank_sel = GPU_SEL
    mfu = targets(("training_job:training_mfu:avg", "{{training_job}} MFU (job)"),
                  (f"avg by (__ID__, training_job) (training_mfu_ratio{{{HOST_SEL}}})", "{{__ID__}} MFU"),
                  (f"avg by (__ID__) (DCGM_FI_DEV_GPU_UTIL{{{HOST_SEL}}}) / 100 {on_training}",
                   "{{__ID__}} GPU_UTIL"),
                  (f"avg by (__ID__) (DCGM_FI_PROF_SM_ACTIVE{{{HOST_SEL}}}) {on_training}",
                   "{{__ID__}} SM active"),
                  (f"avg by (__ID__) (DCGM_FI_DEV_POWER_USAGE{{{HOST_SEL}}}) {on_training}",
                   "{{__ID__}} power"),
                  (f"avg by (__ID__) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{HOST_SEL}}}) {on_training}",
                   "{{__ID__}} tensor pipe active"))
    panels = [
        panel(1, "MFU and the collective-hang signature", "percentunit", mfu, w=24, h=9, minv=0,
              overrides=[override("E", "watt")],
              description="Model FLOPs utilisation (achieved / peak). A hung collective drops MFU to 0 and "
                          "stops steps while GPU_UTIL stays ~100 % (an NCCL kernel spins) and SM activity and "
                          "power (right axis) collapse (TrainingCollectiveHang). SM active needs "
                          "DCGM_FI_PROF_SM_ACTIVE (commented out in every shipped counters CSV; recommended.csv "
                          "enables it); on a stock exporter tensor-pipe activity collapses the same way."),
        panel(2, "Step time by rank", "s",
              targets((f"rank:training_step_duration_seconds:mean5m{{{rank_sel}}}",
                       "rank {{rank}} ({{__ID__}} GPU {{gpu}})"),
                      ("training_job:training_step_duration_seconds:median_of_ranks5m",
                       "{{training_job}} median of ranks")),
              description="Each rank's own busy time per step (5m mean) against the job median: a straggler "
                          "stands out (TrainingStraggler)."),
        panel(3, "Stragglers: rank step time / job median", "suffix:x",
              targets((f"rank:training_step_duration_seconds:mean5m{{{rank_sel}}} / on (training_job) group_left "
                       "training_job:training_step_duration_seconds:median_of_ranks5m", "rank {{rank}}")),
              steps=thresholds((1.3, "red")),
              description="Above 1.3x for 3 minutes is a straggler: every other rank waits for it in the "
                          "all-reduce."),
        panel(4, "Collective time (NCCL, including waits)", "s",
              targets(*quantiles("nccl_collective_duration_seconds", rank_sel, by="training_job, collective",
                                 qs=(0.5, 0.99), legend_prefix="{{training_job}} {{collective}} "),
                      (f"sum by (rank, collective) (rate(nccl_collective_duration_seconds_sum{{{rank_sel}}}"
                       "[$__rate_interval])) / sum by (rank, collective) "
                       f"(rate(nccl_collective_duration_seconds_count{{{rank_sel}}}[$__rate_interval]))",
                       "rank {{rank}} {{collective}} mean")),
              description="Wall time inside collectives, waiting for the slowest rank included: healthy ranks "
                          "show a straggler's cost here, the straggler itself the least."),
        panel(5, "Steps per second", "suffix: steps/s",
              targets((f"max by (training_job) (rate(training_steps_total{{{HOST_SEL}}}[$__rate_interval]))",
                       "{{training_job}}")),
              description="Job progress; flat at 0 with GPUs busy is a hang."),
        panel(6, "Step time quantiles (per job)", "s",
              targets(*quantiles("training_step_duration_seconds", rank_sel, by="training_job", qs=(0.5, 0.99),
                                 legend_prefix="{{training_job}} ")),
              description="Distribution of per-rank step times across the selected ranks."),
    ]
    variables = [datasource_var(),
                 query_var("__ID__", "label_values(training_mfu_ratio, __ID__)"),
                 query_var("gpu", 'label_values(training_mfu_ratio{__ID__=~"$__ID__"}, gpu)')]
    return dashboard("gpuobs-training", "Training",
                     "Training jobs: MFU, step time per rank, stragglers, NCCL collective time, and hangs.",
                     variables, panels)


# ---- Release --------------------------------------------------------------------------------------------
def release() -> dict:
    vsel = f'{TRACK_SEL}, model_name=~"$model_name"'
    dsel = f'__DCGM__, {TRACK_SEL}'
    success = f"vllm:request_success_total{{{vsel}"

    def by_track(metric: str, q: float) -> tuple[str, str]:
        return (f"histogram_quantile({q}, sum by (track, le) (rate({metric}_bucket{{{vsel}}}[$__rate_interval])))",
                f"{{{{track}}}} p{round(q * 100)}")

    panels = [
        panel(1, "Engine version by track", "none",
              [target(f"count by (track, version) (gpuobs_engine_build_info{{{vsel}}})", "nodes", "A", table=True)],
              kind="table", w=8, h=8,
              description="Serving nodes per track and engine version (gpuobs_engine_build_info). The rollout "
                          "controller labels its canary and baseline targets track=canary|baseline."),
        panel(10, "Request rate by track", "reqps",
              targets((f"sum by (track) (rate({success}}}[$__rate_interval]))", "{{track}}")), w=16, h=8,
              description="Traffic each track serves: too few requests and the canary analysis holds (no "
                          "verdict on little data)."),
        panel(2, "TTFT p50: canary vs baseline", "s", targets(by_track("vllm:time_to_first_token_seconds", 0.5))),
        panel(3, "TTFT p99: canary vs baseline", "s", targets(by_track("vllm:time_to_first_token_seconds", 0.99))),
        panel(4, "Inter-token latency: canary vs baseline", "s",
              targets(by_track("vllm:inter_token_latency_seconds", 0.5),
                      by_track("vllm:inter_token_latency_seconds", 0.99))),
        panel(5, "E2E latency: canary vs baseline", "s",
              targets(by_track("vllm:e2e_request_latency_seconds", 0.5),
                      by_track("vllm:e2e_request_latency_seconds", 0.99))),
        panel(6, "Error ratio: canary vs baseline", "percentunit",
              targets((f'sum by (track) (rate({success}, finished_reason="error"}}[$__rate_interval])) / '
                       f"sum by (track) (rate({success}}}[$__rate_interval]))", "{{track}}"))),
        panel(7, "GPU energy per generated token: canary vs baseline", "joule",
              targets((f"sum by (track) (max by (track, __ID__, UUID) (DCGM_FI_DEV_POWER_USAGE{{{dsel}}})) / "
                       f'sum by (track) (rate(vllm:generation_tokens_total{{__VLLM__, {vsel}}}[$__rate_interval]))',
                       "{{track}}")),
              description="GPU power of each track's nodes over its generated tokens per second."),
        panel(8, "KV-cache usage: canary vs baseline", "percentunit",
              targets((f"avg by (track) (vllm:kv_cache_usage_perc{{{vsel}}})", "{{track}}")), minv=0, maxv=1),
        panel(9, "SM active: canary vs baseline", "percentunit",
              targets((f"avg by (track) (DCGM_FI_PROF_SM_ACTIVE{{{dsel}}})", "{{track}} SM active"),
                      (f"avg by (track) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{dsel}}})", "{{track}} tensor pipe active")),
              minv=0, maxv=1,
              description="A release that does the same work with less SM activity is more efficient; one "
                          "that idles the SMs may be stalling. SM active needs recommended.csv; on a stock "
                          "exporter only tensor-pipe activity has data."),
        panel(11, "Feature flags: serving nodes with the flag on", "none",
              targets(('sum by (flag) (gpuobs_feature_flag_enabled{__VLLM__, model_name=~"$model_name"})', "{{flag}}")),
              w=24, minv=0, decimals=0, draw="bars",
              description="How many serving nodes evaluate each feature flag on (gpuobs_feature_flag_enabled, "
                          "as the engines read the flag file through OpenFeature). A `gpuobs flag rollout` "
                          "climbs stage by stage; `gpuobs flag kill` drops it to 0 everywhere at once. A "
                          "vLLM fleet without gpuobs's flag file has no such series (no data)."),
    ]
    stages = {"datasource": DS, "enable": True, "hide": False, "iconColor": "orange", "name": "Rollout stages",
              # Each stage deploys to more nodes, which changes how many nodes run each version
              # (gpuobs_engine_build_info, one series per node): one annotation per deploy or rollback.
              "expr": "changes((count by (version) (gpuobs_engine_build_info))[1m:15s]) > 0", "step": "15s",
              "titleFormat": "deploy: {{version}}", "textFormat": "nodes running {{version}} changed",
              "tagKeys": "version", "useValueForTime": False}
    variables = [datasource_var(),
                 query_var("model_name", "label_values(vllm:num_requests_running, model_name)")]
    return dashboard("gpuobs-release", "Release",
                     "Canary vs baseline for each metric the canary analysis judges, with each stage's deploys "
                     "(changes in how many nodes run each version) as annotations.", variables, panels, annotations=[stages], time_from="now-3h")


DASHBOARDS = {"fleet.json": fleet, "serving.json": serving, "memory.json": memory, "training.json": training,
              "release.json": release}


def render_all(cfg: "FleetConfig | None" = None) -> dict[str, str]:
    """File name -> the exact text the file must hold for the fleet config ``cfg`` (default: the
    default config, which the shipped prometheus/fleet.yaml equals)."""
    from gpuobs.core.fleet import FleetConfig

    cfg = cfg or FleetConfig()
    subst = {ID: cfg.identity_label, DCGM: json.dumps(cfg.dcgm_selector)[1:-1],
             VLLM: json.dumps(cfg.vllm_selector)[1:-1]}
    out = {}
    for name, build in DASHBOARDS.items():
        text = json.dumps(build(), indent=2) + "\n"
        for token, value in subst.items():
            text = text.replace(token, value)
        out[name] = text
    return out


def write_dashboards(out: Path | None = None, check: bool = False,
                     cfg: "FleetConfig | None" = None) -> tuple[list[Path], list[str]]:
    """Write every dashboard for ``cfg`` into ``out`` (default: the asset root's ``grafana/dashboards``),
    or with ``check`` write nothing and list the files that differ. Returns ``(written paths, stale names)``."""
    out = out or assets.path("grafana/dashboards")
    files = render_all(cfg)
    if check:
        return [], stale_files(out, files)
    return write_tree(out, files), []
