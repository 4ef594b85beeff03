"""Offline checks of the compose stack (compose/docker-compose.yml, compose/Dockerfile, compose/prometheus.yml).

No Docker engine is needed: the file is validated against the Compose Specification's JSON schema
(compose/compose-spec.json) as Compose reads it with no GPUOBS_* override set, its mounts, networks, ports, images and healthchecks are checked as data,
the compose Prometheus config goes through the real promtool, and both modes are shown to load the
same rule files and the same Alertmanager config. ``docker compose config`` runs too where the compose
plugin exists.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from gpuobs.exporter.sim.identity import hostname
from gpuobs.core.fleet import RUNBOOK_BASE
from gpuobs.stack.render import Ports, render_alertmanager, render_prometheus
from gpuobs.stack.supervisor import StackConfig

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
SCHEMA_FILE = COMPOSE_DIR / "compose-spec.json"
SHARED_SCHEMA = ROOT.parent / "shared" / "schemas" / "compose-spec.json"

NODES = [f"node-{i}" for i in range(4)]
UI_SERVICES = {"prometheus", "pager", "grafana", "jaeger"}  # alertmanager publishes through pager
#: The Compose profile `ha` (tests/stack/test_compose_ha.py checks it in depth).
HA_SERVICES = {"victoria-metrics", "vmalert", *(f"alertmanager-{i}" for i in range(3)),
               *(f"prometheus-s{s}-r{r}" for s in range(2) for r in range(2))}
ALL_SERVICES = set(NODES) | UI_SERVICES | {"alertmanager"} | HA_SERVICES
#: Where the ha profile's rendered files come from unless GPUOBS_HA_DIR says otherwise (rendered by
#: `gpuobs compose up --topology ha`, so absent on a clean clone).
HA_DIR_DEFAULT = "../.run/compose-ha"


# ---- helpers ---------------------------------------------------------------------------------------
#: ``${NAME:-default}``: a GPUOBS_* override with its default (Compose interpolation).
INTERPOLATION_RE = re.compile(r"\$\{(GPUOBS_[A-Z_]+):-([^}]*)\}")


def interpolated(text: str) -> str:
    """The compose file as Compose reads it with no GPUOBS_* variable set: every ``${VAR:-default}``
    becomes its default. Any other ``$`` use (``$$`` escapes aside) fails, so none slips in."""
    out = INTERPOLATION_RE.sub(lambda m: m.group(2), text)
    assert not re.search(r"(?<!\$)\$(?!\$)\{", out.replace("$$", "")), "interpolation without a default"
    return out


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(interpolated(COMPOSE_FILE.read_text()))


def test_every_override_is_a_gpuobs_variable_with_a_default():
    names = INTERPOLATION_RE.findall(COMPOSE_FILE.read_text())
    assert {n for n, _ in names} == {
        "GPUOBS_BASE_IMAGE", "GPUOBS_PAGER_PORT", "GPUOBS_ALERTMANAGER_PORT", "GPUOBS_PROMETHEUS_PORT",
        "GPUOBS_ALERTMANAGER_IMAGE", "GPUOBS_PROMETHEUS_IMAGE", "GPUOBS_RULES_DIR", "GPUOBS_GRAFANA_PORT",
        "GPUOBS_JAEGER_PORT", "GPUOBS_OTLP_GRPC_PORT", "GPUOBS_OTLP_HTTP_PORT", "GPUOBS_FRONT_BRIDGE",
        "GPUOBS_HA_DIR", "GPUOBS_VICTORIA_METRICS_IMAGE", "GPUOBS_VICTORIA_METRICS_PORT"}


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def bind_mounts(svc: dict) -> list[tuple[str, str, bool]]:
    """(host source, container target, read_only) for each bind mount; named volumes are skipped."""
    out = []
    for v in svc.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            src, dst = parts[0], parts[1]
            ro = len(parts) > 2 and "ro" in parts[2].split(",")
        else:
            if v.get("type") != "bind":
                continue
            src, dst, ro = v["source"], v["target"], bool(v.get("read_only"))
        if src.startswith((".", "/")):
            out.append((src, dst, ro))
    return out


def mount_target(svc: dict, source: str) -> str:
    """Container path at which ``source`` (as written in the compose file) is bind-mounted."""
    hits = [dst for src, dst, _ in bind_mounts(svc) if src == source]
    assert len(hits) == 1, f"{source} should be mounted exactly once, found {hits}"
    return hits[0]


def parse_port(p) -> tuple[str | None, str | None, str]:
    """(host_ip, published, target) of a short- or long-syntax port entry."""
    if isinstance(p, dict):
        return p.get("host_ip"), str(p["published"]) if "published" in p else None, str(p["target"])
    if isinstance(p, int):
        return None, None, str(p)
    text = p.split("/")[0]
    if text.startswith("["):  # [::1]:port:port
        ip, rest = text[1:].split("]:", 1)
        published, target = rest.split(":")
        return ip, published, target
    parts = text.split(":")
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    if len(parts) == 2:
        return None, parts[0], parts[1]
    return None, None, parts[0]


def netns_owner(services: dict, name: str) -> str:
    """The service whose network namespace ``name`` lives in (itself unless network_mode: service:X)."""
    mode = services[name].get("network_mode")
    if mode is None:
        return name
    assert mode.startswith("service:"), f"{name}: network_mode {mode!r}; only service:<name> is allowed"
    return mode.removeprefix("service:")


def networks_of(svc: dict) -> list[str]:
    nets = svc.get("networks", [])
    return list(nets) if isinstance(nets, (list, dict)) else []


def flag_value(argv: list[str], flag: str) -> str:
    """Value of ``--flag=value`` or ``--flag value`` in a command list."""
    for i, arg in enumerate(argv):
        if arg == flag:
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {argv}")


# ---- schema ------------------------------------------------------------------------------------------
def test_compose_file_validates_against_the_compose_spec_schema(compose):
    schema = json.loads(SCHEMA_FILE.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_schema_really_rejects_bad_compose_files(compose):
    """Guards against a schema that accepts anything (e.g. an empty or truncated copy)."""
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA_FILE.read_text()))
    bad = json.loads(json.dumps(compose))
    bad["services"]["prometheus"]["helthcheck"] = {"test": ["CMD", "true"]}  # misspelt key
    assert not validator.is_valid(bad)
    bad = json.loads(json.dumps(compose))
    bad["networks"]["backend"]["internal"] = ["yes"]  # boolean (or an interpolated string) only
    assert not validator.is_valid(bad)


def test_schema_copy_is_the_shared_one():
    if not SHARED_SCHEMA.exists():
        pytest.skip(f"{SHARED_SCHEMA} not present (clone without shared/)")
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(SCHEMA_FILE) == digest(SHARED_SCHEMA), "compose/compose-spec.json drifted from shared/"


def test_docker_compose_config_accepts_the_file():
    docker = shutil.which("docker")
    if not docker or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("the docker compose plugin is not installed here")
    r = subprocess.run([docker, "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# ---- services, mounts ---------------------------------------------------------------------------------
def test_every_component_has_a_service(services):
    assert set(services) == ALL_SERVICES


def test_every_bind_mount_exists_and_is_read_only(services):
    seen = set()
    for name, svc in services.items():
        for src, dst, ro in bind_mounts(svc):
            seen.add((name, src))
            assert ro, f"{name}: {src} -> {dst} must be mounted :ro"
            if src == HA_DIR_DEFAULT:  # rendered at `up --topology ha`; test_compose_ha.py checks its files
                assert name in HA_SERVICES, name
                continue
            assert (COMPOSE_DIR / src).resolve().exists(), f"{name}: {src} does not exist (relative to compose/)"
            assert ro, f"{name}: {src} -> {dst} must be mounted :ro"
    assert seen == {("prometheus", "./prometheus.yml"), ("prometheus", "./targets"),
                    ("prometheus", "../prometheus/rules"), ("alertmanager", "../alertmanager"),
                    ("pager", "../runbooks"), ("grafana", "../grafana/grafana.ini"),
                    ("grafana", "../grafana/provisioning"), ("grafana", "../grafana/dashboards"),
                    *((n, HA_DIR_DEFAULT) for n in HA_SERVICES if n != "victoria-metrics"),
                    *((n, "./targets") for n in HA_SERVICES if n.startswith("prometheus-"))}


def test_named_volumes_are_declared(compose, services):
    declared = set(compose.get("volumes") or {})
    used = set()
    for svc in services.values():
        for v in svc.get("volumes", []):
            src = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
            if src and not src.startswith((".", "/")):
                used.add(src)
    assert used == declared == {"prometheus-data", "alertmanager-data", "pager-data", "grafana-data",
                                *(f"{n}-data" for n in HA_SERVICES if n != "vmalert")}


def test_shared_configs_are_mounted_not_copied(services):
    """The repository's own rules, Alertmanager config, dashboards and runbooks, at fixed paths."""
    assert mount_target(services["prometheus"], "../prometheus/rules") == "/etc/prometheus/rules"
    assert mount_target(services["alertmanager"], "../alertmanager") == "/etc/alertmanager"
    assert mount_target(services["grafana"], "../grafana/dashboards") == "/var/lib/grafana/dashboards"
    assert mount_target(services["pager"], "../runbooks") == flag_value(services["pager"]["command"], "--runbooks-dir")
    # No rule or Alertmanager file lives under compose/: a copy would drift.
    assert not list(COMPOSE_DIR.rglob("alertmanager*.yml"))
    assert not [p for p in COMPOSE_DIR.rglob("*.yml") if "groups" in (yaml.safe_load(p.read_text()) or {})]


# ---- networks and ports -------------------------------------------------------------------------------
def test_backend_is_internal_and_front_has_no_masquerade(compose):
    nets = compose["networks"]
    assert set(nets) == {"backend", "front"}
    assert nets["backend"]["internal"] is True
    assert not nets["front"].get("internal", False)
    opts = nets["front"]["driver_opts"]
    assert opts["com.docker.network.bridge.enable_ip_masquerade"] == "false"
    assert len(opts["com.docker.network.bridge.name"]) <= 15  # Linux interface name limit


def test_services_that_publish_nothing_are_on_internal_networks_only(compose, services):
    internal = {n for n, cfg in compose["networks"].items() if (cfg or {}).get("internal") is True}
    for name in services:
        owner = netns_owner(services, name)
        nets = networks_of(services[owner])
        assert nets, f"{name}: no explicit networks (would land on the default, non-internal network)"
        published = services[owner].get("ports", [])
        if not published:
            assert set(nets) <= internal, f"{name} publishes no port but joins {set(nets) - internal}"
        else:
            assert "backend" in nets, f"{name} must reach the others over the internal network"
    # Only the UI services (and Alertmanager through the pager) have a non-internal network.
    exposed = {n for n in services if set(networks_of(services[netns_owner(services, n)])) - internal}
    assert exposed == UI_SERVICES | {"alertmanager", "victoria-metrics"}


def test_network_mode_services_neither_publish_nor_join_networks(services):
    for name, svc in services.items():
        if "network_mode" in svc:
            assert "ports" not in svc and "networks" not in svc, name
    assert services["alertmanager"]["network_mode"] == "service:pager"
    assert services["alertmanager"]["depends_on"]["pager"]["condition"] == "service_healthy"


def test_every_published_port_binds_loopback_only(services):
    published = {}
    for name, svc in services.items():
        for p in svc.get("ports", []):
            host_ip, host_port, target = parse_port(p)
            assert host_ip == "127.0.0.1", f"{name}: port {p!r} must bind 127.0.0.1"
            assert host_port == target, f"{name}: {p!r} should keep the native port number"
            published[int(host_port)] = name
    assert published == {9090: "prometheus", 9093: "pager", 9097: "pager", 3000: "grafana",
                         16686: "jaeger", 4317: "jaeger", 4318: "jaeger", 8428: "victoria-metrics"}


# ---- images, healthchecks, Dockerfile --------------------------------------------------------------------
IMAGE_RE = re.compile(r"^(?P<repo>[a-z0-9][a-z0-9._/-]*):(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]*)"
                      r"(@sha256:(?P<digest>[0-9a-f]{64}))?$")


def test_images_are_local_or_pinned_and_never_pulled(services):
    """Air-gapped: every image is built locally (`make images`) or loaded (Grafana, Jaeger), and
    `pull_policy: never` keeps Compose from ever asking a registry."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    local = {"prometheus": "gpuobs-prometheus:bookworm", "alertmanager": "gpuobs-alertmanager:bookworm",
             "victoria-metrics": "gpuobs-victoria-metrics:bookworm", "vmalert": "gpuobs-victoria-metrics:bookworm"}
    local.update({n: services[n.split("-")[0]]["image"] for n in HA_SERVICES if n.startswith(("prometheus-", "alertmanager-"))})
    local.update({n: f"gpuobs:{version}" for n in [*NODES, "pager"]})
    for name, svc in services.items():
        assert svc.get("pull_policy") == "never", name
        m = IMAGE_RE.match(svc.get("image", ""))
        assert m and m["tag"] != "latest", f"{name}: image {svc.get('image')!r} has no explicit tag"
        if name in local:
            assert svc["image"] == local[name], name
    # The loaded ones are pinned to exact upstream releases.
    assert re.fullmatch(r"grafana/grafana-oss:1[01]\.\d+\.\d+", services["grafana"]["image"])
    assert re.fullmatch(r"jaegertracing/all-in-one:1\.\d+\.\d+", services["jaeger"]["image"])


def test_the_images_script_builds_every_local_image(services):
    script = (ROOT / "scripts" / "build-images.sh").read_text()
    for name in ("prometheus", "alertmanager", "victoria-metrics"):
        repo, tag = services[name]["image"].split(":")
        assert f"rootfs {repo}:$SUITE" in script and tag == "bookworm"
    assert "rootfs gpuobs-python:$SUITE" in script and "--variant=minbase" in script
    assert "--network none" in script and "-f compose/Dockerfile" in script


def test_grafana_and_jaeger_are_optional_profiles_the_rest_always_runs(services):
    from gpuobs.stack.compose import OPTIONAL_PROFILES

    profiles = {name: svc.get("profiles") for name, svc in services.items()}
    assert profiles == {**{n: None for n in services}, "grafana": ["grafana"], "jaeger": ["jaeger"],
                        **{n: ["ha"] for n in HA_SERVICES}}
    assert set(OPTIONAL_PROFILES) == {"grafana", "jaeger"}


def test_the_local_image_is_built_from_compose_dockerfile_and_tagged_with_the_package_version(services):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for name in [*NODES, "pager"]:
        svc = services[name]
        assert svc["build"] == {"context": "..", "dockerfile": "compose/Dockerfile", "network": "none",
                                "args": {"BASE_IMAGE": "gpuobs-python:bookworm"}}, name
        assert svc["image"] == f"gpuobs:{version}", name
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert svc["security_opt"] == ["no-new-privileges:true"], name
    assert (COMPOSE_DIR / ".." / "compose" / "Dockerfile").resolve().is_file()
    # The pager runs as the image's unprivileged user; the nodes start as root with the three
    # capabilities their entry point needs (drop the default route, then setpriv to uid 10001).
    assert "user" not in services["pager"] and "cap_add" not in services["pager"]
    for name in NODES:
        assert services[name]["user"] == "0:0"
        assert services[name]["cap_add"] == ["NET_ADMIN", "SETUID", "SETGID"]
        assert services[name]["entrypoint"] == ["/usr/local/bin/gpuobs-node-entrypoint"]


def test_every_service_has_a_healthcheck_probing_its_own_port(services):
    probes = {"prometheus": "127.0.0.1:9090/-/ready", "alertmanager": "127.0.0.1:9093/-/ready",
              "pager": "127.0.0.1:9097/health", "grafana": "127.0.0.1:3000/api/health",
              "jaeger": "127.0.0.1:14269/", "victoria-metrics": "127.0.0.1:8428/health",
              "vmalert": "127.0.0.1:8880/health"}
    probes.update({n: "127.0.0.1:9093/-/ready" for n in HA_SERVICES if n.startswith("alertmanager-")})
    probes.update({n: "127.0.0.1:9090/-/ready" for n in HA_SERVICES if n.startswith("prometheus-")})
    probes.update({n: "127.0.0.1:9400/health" for n in NODES})
    serving = NODES[: len(NODES) - StackConfig().training_nodes]
    for name, svc in services.items():
        hc = svc.get("healthcheck")
        assert hc and not hc.get("disable"), f"{name}: no healthcheck"
        assert hc["test"][0] in ("CMD", "CMD-SHELL") and hc["test"] != ["NONE"], name
        assert probes[name] in " ".join(hc["test"]), f"{name}: healthcheck should probe {probes[name]}"
        assert hc["interval"] and hc["retries"] >= 3
    for n in serving:  # the serving engine is part of a serving node's health
        assert "127.0.0.1:8000/metrics" in " ".join(services[n]["healthcheck"]["test"])


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (COMPOSE_DIR / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_builds_from_a_local_base_and_the_wheelhouse_only(services):
    ins = dockerfile_instructions()
    args = [rest for word, rest in ins if word == "ARG"]
    assert args == ["BASE_IMAGE=gpuobs-python:bookworm"]
    froms = [rest for word, rest in ins if word == "FROM"]
    assert froms == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]
    copied = [rest.split()[:-1] for word, rest in ins if word == "COPY"]
    assert sorted(sum(copied, [])) == ["--from=build", "/opt/gpuobs", "build/wheelhouse/", "compose/node-entrypoint.sh"]
    # The build context holds exactly what the Dockerfile copies from it (nothing else can leak in).
    ignore = [ln for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert ignore == ["*", "!build/wheelhouse/", "!compose/node-entrypoint.sh"]
    assert any("pip install --no-index" in rest and "--find-links /wheels \"gpuobs[k8s]\"" in rest
               for word, rest in ins if word == "RUN")
    user = [rest for word, rest in ins if word == "USER"][-1]
    uid = user.split(":")[0]
    assert uid not in ("0", "root") and int(uid) >= 1000
    assert json.loads([rest for word, rest in ins if word == "ENTRYPOINT"][-1]) == ["gpuobs"]
    # The node tmpfs that receives the admin token belongs to that same uid, and the entry point
    # drops to it.
    tmpfs = [t for t in services["node-0"]["tmpfs"] if t.startswith("/run/gpuobs")]
    assert tmpfs == [f"/run/gpuobs:uid={uid},gid={uid},mode=0700"]
    assert f"--reuid={uid} --regid={uid}" in (COMPOSE_DIR / "node-entrypoint.sh").read_text()


def test_node_entrypoint_is_valid_sh_and_drops_the_default_route_before_dropping_root():
    path = COMPOSE_DIR / "node-entrypoint.sh"
    assert path.stat().st_mode & 0o111, "must be executable (COPY keeps the mode)"
    r = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = path.read_text()
    assert text.index("route del default") < text.index("exec setpriv")
    assert "set -eu" in text  # a failed route deletion stops the container instead of running on


# ---- commands ------------------------------------------------------------------------------------------------
def test_node_services_simulate_native_modes_default_fleet(services):
    """One container per node, and the same fleet as `gpuobs stack up` with its defaults."""
    native = StackConfig()
    assert len(NODES) == native.nodes
    training = [n for n in NODES if "--training-nodes" in services[n]["command"]]
    # The last `training_nodes` nodes train, as in native mode; each says so for its one-node slice.
    assert training == NODES[len(NODES) - native.training_nodes:]
    for name in training:
        assert flag_value(services[name]["command"], "--training-nodes") == "1"
        assert "8000" not in " ".join(services[name]["healthcheck"]["test"])
    for name in NODES:
        argv = services[name]["command"]
        assert flag_value(argv, "--gpus") == str(native.gpus)
        assert flag_value(argv, "--seed") == str(native.seed)
        assert flag_value(argv, "--xid-window-ms") == str(native.xid_window_ms)
    for k, name in enumerate(NODES):
        argv = services[name]["command"]
        assert argv[0] == "exporter"
        assert flag_value(argv, "--host") == "0.0.0.0"
        assert flag_value(argv, "--nodes") == "1"
        assert flag_value(argv, "--node-offset") == str(k)
        assert flag_value(argv, "--base-port") == "9400"
        assert flag_value(argv, "--engine-base-port") == "8000"
        assert flag_value(argv, "--token-file") == "/run/gpuobs/admin-token"
        assert services[name]["hostname"] == hostname("gpu-node", k)
        assert services[name]["networks"] == ["backend"]


def test_gpuobs_commands_parse_with_the_real_cli(services):
    """The compose commands are valid `gpuobs` invocations, and mean what the file says."""
    from gpuobs.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(services["pager"]["command"])
    assert (args.host, args.port, args.db) == ("0.0.0.0", 9097, "/var/lib/gpuobs/pager.sqlite")
    assert mount_target(services["pager"], "../runbooks") == args.runbooks_dir
    for k, name in enumerate(NODES):
        args = parser.parse_args(services[name]["command"])
        assert (args.host, args.nodes, args.node_offset) == ("0.0.0.0", 1, k)
        assert (args.base_port, args.engine_base_port) == (9400, 8000)
        assert args.token_file == "/run/gpuobs/admin-token"


# ---- Prometheus: compose config, file_sd targets, promtool, parity with native ------------------------------------
@pytest.fixture(scope="module")
def prom_compose() -> dict:
    return yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())


def test_file_sd_targets_list_every_node_with_its_hostname_label(services, prom_compose):
    """Same jobs, same file names and the same node=<Hostname> labels as native mode; addresses are
    the node containers (every node on dcgm, the serving nodes on vllm)."""
    native = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    native_jobs = {sc["job_name"]: sc for sc in native["scrape_configs"]}
    jobs = {sc["job_name"]: sc for sc in prom_compose["scrape_configs"]}
    assert set(native_jobs) <= set(jobs)
    targets_dir = mount_target(services["prometheus"], "./targets")
    n_serving = len(NODES) - StackConfig().training_nodes
    for job, port, count in (("dcgm", 9400, len(NODES)), ("vllm", 8000, n_serving)):
        (pattern,) = jobs[job]["file_sd_configs"][0]["files"]
        (native_pattern,) = native_jobs[job]["file_sd_configs"][0]["files"]
        assert pattern == f"{targets_dir}/{Path(native_pattern).name}"
        files = sorted((COMPOSE_DIR / "targets").glob(Path(pattern).name))
        assert [f.name for f in files] == [f"{job}-nodes.json"]
        got = {g["targets"][0]: g["labels"] for g in json.loads(files[0].read_text())}
        # Like native mode (render.write_targets), vLLM targets also carry Hostname: the vLLM page has none.
        extra = (lambda k: {"Hostname": hostname("gpu-node", k)}) if job == "vllm" else (lambda k: {})
        assert got == {f"node-{k}:{port}": {"node": hostname("gpu-node", k), **extra(k)} for k in range(count)}
        for target in got:
            assert target.split(":")[0] in services


def test_compose_prometheus_loads_the_mounted_rules_and_alerts_via_the_pager(services, prom_compose):
    rules_dir = mount_target(services["prometheus"], "../prometheus/rules")
    assert prom_compose["rule_files"] == [f"{rules_dir}/*.yml"]
    config_file = flag_value(services["prometheus"]["command"], "--config.file")
    assert mount_target(services["prometheus"], "./prometheus.yml") == config_file
    targets = prom_compose["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert targets == ["pager:9093"]
    assert flag_value(services["alertmanager"]["command"], "--web.listen-address") == ":9093"


def test_compose_and_native_share_the_global_intervals(prom_compose):
    native = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    assert prom_compose["global"] == native["global"]


def test_both_modes_load_the_same_rule_files(tmp_path, prom_compose):
    """Native mode renders prometheus/rules/*.yml into its run dir; compose mounts the same directory."""
    repo_rules = {p.name: p.read_text() for p in sorted((ROOT / "prometheus" / "rules").glob("*.yml"))}
    assert repo_rules, "no rule files"
    native_cfg = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    assert native_cfg["rule_files"] == ["rules/*.yml"]  # relative to prometheus/, i.e. the same directory
    # Keyword arguments by name, so a new optional parameter of render_prometheus does not break this.
    values = {"run": tmp_path, "ports": Ports(), "nodes": [(hostname("gpu-node", 0), 9400)],
              "engines": [(hostname("gpu-node", 0), 8000)], "runbook_base": RUNBOOK_BASE}
    params = inspect.signature(render_prometheus).parameters
    cfg_path = render_prometheus(**{k: v for k, v in values.items() if k in params})
    (pattern,) = yaml.safe_load(cfg_path.read_text())["rule_files"]
    rendered = {p.name: p.read_text() for p in sorted(Path(pattern).parent.glob(Path(pattern).name))}
    # Same files, same text (with the default runbook base the render changes nothing).
    assert rendered == repo_rules
    assert Path(prom_compose["rule_files"][0]).name == Path(pattern).name == "*.yml"


def test_promtool_accepts_the_compose_prometheus_config(tmp_path, prom_compose):
    """promtool checks the config, the rule files it loads and the file_sd files; container paths are
    pointed at the repository's directories in a temp copy, nothing else changes."""
    cfg = json.loads(json.dumps(prom_compose))
    cfg["rule_files"] = [str(ROOT / "prometheus" / "rules" / Path(prom_compose["rule_files"][0]).name)]
    for sc in cfg["scrape_configs"]:
        for sd in sc.get("file_sd_configs", []):
            sd["files"] = [str(COMPOSE_DIR / "targets" / Path(f).name) for f in sd["files"]]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    r = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "SUCCESS" in out and "does not exist" not in out and "WARNING" not in out, out
    n_rules = len(list((ROOT / "prometheus" / "rules").glob("*.yml")))
    assert out.count("SUCCESS") >= 1 + n_rules, out  # the config and each rule file


# ---- Alertmanager: the shared config, reachable as in native mode ----------------------------------------------
def test_alertmanager_uses_the_shared_config_and_reaches_the_pager_on_loopback(tmp_path, services):
    argv = services["alertmanager"]["command"]
    config_dir = mount_target(services["alertmanager"], "../alertmanager")
    assert flag_value(argv, "--config.file") == f"{config_dir}/alertmanager.yml"
    assert "--cluster.listen-address=" in argv  # empty: no gossip
    assert flag_value(argv, "--web.external-url") == "http://127.0.0.1:9093"
    cfg = yaml.safe_load((ROOT / "alertmanager" / "alertmanager.yml").read_text())
    urls = [wh["url"] for r in cfg["receivers"] for wh in r.get("webhook_configs", [])]
    assert urls
    pager_port = flag_value(services["pager"]["command"], "--port")
    for url in urls:
        # Loopback inside the pager's network namespace, where the pager listens on all addresses.
        assert url.startswith(f"http://127.0.0.1:{pager_port}/hook/"), url
    assert flag_value(services["pager"]["command"], "--host") == "0.0.0.0"
    # Native mode with the default ports renders the very same configuration.
    native = yaml.safe_load(render_alertmanager(tmp_path, Ports(pager=int(pager_port))).read_text())
    assert native == cfg
