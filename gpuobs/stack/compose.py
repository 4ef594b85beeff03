"""Compose mode of the stack: ``make up|down|status`` through Docker Compose, and drills on its nodes.

``python -m gpuobs.stack.compose check|up|down|status --run-dir DIR`` is what the Makefile runs.
``check`` decides the mode: compose only when the Docker engine answers, the Compose v2 plugin is
installed and every image the stack needs is present locally (the file says ``pull_policy: never``:
the stack is air-gapped, ``make images`` builds the images). Otherwise it prints one line saying why
and which command fixes it, and the Makefile starts the native stack instead.

``up`` starts the stack with ``docker compose up --wait`` (every healthcheck passes, or it fails),
tears it down again if that fails (never a half-started stack), and records in ``<run>/compose.json``
what the drills and reports need: the project, the containers of the nodes, the host URLs of
Prometheus, Alertmanager and the pager. Grafana and Jaeger (Compose profiles ``grafana``/``jaeger``)
start only when their images have been loaded (``docker load``).

``up --topology ha`` runs the Compose profile ``ha`` instead of the single Prometheus and Alertmanager:
the native HA topology's members (:mod:`gpuobs.stack.ha`: 2 Prometheus shards x 2 replicas, a
3-member Alertmanager cluster gossiping by service name, VictoriaMetrics with replica dedup, vmalert
with the fleet-wide rules) in containers, next to the same node containers and pager. It renders the
files they mount with :func:`gpuobs.stack.ha.render_compose_ha` into ``<run>/compose-ha``
(``GPUOBS_HA_DIR``) and names the services to start, so the single pipeline stays down.

:class:`ComposeAdmin` is the drills' access to a node container: the fault admin API listens on the
container's loopback only (docs/faults.md), so calls go through ``docker exec`` as the gpuobs user with the
admin token in the container's tmpfs; the ``down`` fault stops the container itself (``docker stop``)
and clearing it starts it again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpuobs.core import assets
from gpuobs.core.errors import Failure
from gpuobs.core.files import atomic_write
from gpuobs.promapi.exporter_admin import AdminClient, AdminError
from gpuobs.stack.state import StackState, StackUrls

#: The compose file; compose mode runs from a checkout (its images are built from the repository).
COMPOSE_FILE = (assets.checkout_root() or Path.cwd()) / "compose" / "docker-compose.yml"
DEFAULT_PROJECT = "gpuobs"
#: Optional services, started only when their image is present (Compose profiles of the same name).
OPTIONAL_PROFILES = ("grafana", "jaeger")
#: The HA profile (``up --topology ha``); its services replace the single Prometheus and Alertmanager.
HA_PROFILE = "ha"
SINGLE_ONLY = ("prometheus", "alertmanager")
TOPOLOGIES = ("single", "ha")
HA_DIR = "compose-ha"
#: The node containers' admin API and token, inside each container (compose/docker-compose.yml).
NODE_ADMIN_URL = "http://127.0.0.1:9400"
NODE_TOKEN_FILE = "/run/gpuobs/admin-token"
NODE_USER = "10001:10001"
STATE_FILE = "compose.json"

# Runs inside a node container (python3 of the gpuobs image): one admin-API call, the reply as JSON
# on stdout ({"status": HTTP status, "body": parsed body}). Only the stable HTTP API is used.
_ADMIN_CALL = r"""
import json, sys, urllib.error, urllib.request
method, url, token_file, body = sys.argv[1:5]
token = open(token_file).read().strip()
req = urllib.request.Request(url, method=method, data=body.encode() if body else None,
                             headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=5) as r:
        status, text = r.status, r.read().decode()
except urllib.error.HTTPError as e:
    status, text = e.code, e.read().decode()
try:
    doc = json.loads(text)
except ValueError:
    doc = {"error": text.strip()}
print(json.dumps({"status": status, "body": doc}))
"""


class ComposeError(Failure):
    """A compose operation failed; the message says what and how to fix it."""


def _run(argv: list[str], timeout: float = 120, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        raise ComposeError(f"{argv[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise ComposeError(f"{' '.join(argv[:4])} ... did not finish within {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        raise ComposeError(f"{' '.join(argv[:5])} ... failed (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc


def compose_cmd(project: str, *profiles: str, compose_file: Path = COMPOSE_FILE) -> list[str]:
    """``docker compose -p PROJECT -f FILE [--profile P ...]``."""
    cmd = ["docker", "compose", "-p", project, "-f", str(compose_file)]
    for p in profiles:
        cmd += ["--profile", p]
    return cmd


def images(env: dict | None = None) -> dict[str, str]:
    """Service -> image of every service, optional profiles included, with GPUOBS_* overrides applied
    (from ``docker compose config``). Raises ComposeError if Compose cannot read the file."""
    return {name: svc["image"] for name, svc in _all_services(env).items() if "image" in svc}


def _all_services(env: dict | None = None) -> dict[str, dict]:
    """Service -> its config (``docker compose config``), every profile included."""
    proc = _run(compose_cmd(DEFAULT_PROJECT, *OPTIONAL_PROFILES, HA_PROFILE) + ["config", "--format", "json"], env=env)
    return json.loads(proc.stdout)["services"]


def image_present(image: str) -> bool:
    return _run(["docker", "image", "inspect", image], check=False).returncode == 0


def check(env: dict | None = None, topology: str = "single") -> tuple[bool, str, list[str]]:
    """(usable, one-line reason, optional profiles whose images are present). ``topology``: ``single``
    needs every service without a profile; ``ha`` the nodes, the pager and the ``ha`` profile's services."""
    if topology not in TOPOLOGIES:
        raise ComposeError(f"topology must be one of {', '.join(TOPOLOGIES)}; got {topology!r}")
    if not shutil.which("docker"):
        return False, "no Docker engine (no docker command)", []
    if _run(["docker", "info"], check=False, timeout=30).returncode != 0:
        return False, "no Docker engine answers", []
    if _run(["docker", "compose", "version"], check=False).returncode != 0:
        return False, "Docker answers but the Compose v2 plugin is missing (`make images` installs it)", []
    svcs = _all_services(env)
    by_service = {name: svc["image"] for name, svc in svcs.items() if "image" in svc}
    required = sorted({by_service[svc] for svc in _services_of(svcs, topology) if svc in by_service})
    missing = [img for img in required if not image_present(img)]
    if missing:
        return False, f"Docker answers but image(s) {', '.join(missing)} are missing: build them with `make images`", []
    return True, "Docker, Compose and the images are present", [p for p in OPTIONAL_PROFILES
                                                                if image_present(by_service[p])]


def _services_of(svcs: dict[str, dict], topology: str) -> list[str]:
    """The services a topology starts: every service without a profile (``single``), or those less
    the single Prometheus and Alertmanager plus the ``ha`` profile's (``ha``)."""
    base = [n for n, svc in svcs.items() if not svc.get("profiles") and n not in OPTIONAL_PROFILES]
    if topology == "single":
        return base
    return [n for n in base if n not in SINGLE_ONLY] + [n for n, svc in svcs.items()
                                                          if HA_PROFILE in (svc.get("profiles") or [])]


def _service_config(env: dict | None, project: str, *profiles: str) -> dict:
    return json.loads(_run(compose_cmd(project, *profiles) + ["config", "--format", "json"], env=env).stdout)


def up(run_dir: Path, project: str = DEFAULT_PROJECT, env: dict | None = None, profile: str = "default",
       wait_s: int = 180, out=sys.stdout, topology: str = "single") -> dict:
    """Start the stack and write ``<run_dir>/compose.json``; returns that state. ``env``: the process
    environment with GPUOBS_* overrides (ports, rules directory, front bridge name). ``profile`` only
    records which rule profile the mounted rules are (``drill`` when GPUOBS_RULES_DIR holds rules
    rendered for it), so drills scale their deadlines. Raises ComposeError, after taking down whatever
    started, if the stack does not come up healthy within ``wait_s``.

    ``topology="ha"``: the profile ``ha`` (module docstring); ``profile`` then also picks the rule
    profile rendered into ``<run_dir>/compose-ha`` (``default`` | ``drill``), with runbook links to the
    pager's published port. ``urls.prometheus`` is then VictoriaMetrics (the global view) and
    ``urls.alertmanager`` is empty: the members publish no port (``docker exec`` reaches them)."""
    if topology not in TOPOLOGIES:
        raise ComposeError(f"topology must be one of {', '.join(TOPOLOGIES)}; got {topology!r}")
    env = dict(env if env is not None else os.environ)
    ok, reason, extras = check(env, topology)
    if not ok:
        raise ComposeError(reason)
    services: list[str] = []
    if topology == "ha":
        from gpuobs.stack import ha

        ha_dir = (run_dir / HA_DIR).resolve()
        pager_port = env.get("GPUOBS_PAGER_PORT", "9097")
        try:
            ha.render_compose_ha(ha_dir, COMPOSE_FILE.parent / "prometheus.yml", profile,
                                 f"http://127.0.0.1:{pager_port}")
        except ValueError as exc:
            raise ComposeError(str(exc)) from None
        env["GPUOBS_HA_DIR"] = str(ha_dir)
        extras = [*extras, HA_PROFILE]
        services = _services_of(_all_services(env), "ha") + [p for p in extras if p in OPTIONAL_PROFILES]
    base = compose_cmd(project, *extras)
    print(f"compose: starting project {project}" + (f" with {', '.join(extras)}" if extras else "")
          + " (images are local; nothing is pulled)", file=out, flush=True)
    proc = _run(base + ["up", "-d", "--no-build", "--pull", "never", "--wait", "--wait-timeout", str(wait_s),
                        *services], timeout=wait_s + 60, env=env, check=False)
    if proc.returncode != 0:
        logs = _run(base + ["logs", "--tail", "20"], env=env, check=False).stdout[-3000:]
        _run(base + ["down", "--remove-orphans"], env=env, check=False)
        raise ComposeError(f"the compose stack did not come up healthy (taken down again):\n"
                           f"{(proc.stderr or proc.stdout).strip()[-1500:]}\n{logs}")
    cfg = _service_config(env, project, *extras)
    svcs = {n: c for n, c in cfg["services"].items() if not services or n in services}
    nodes = sorted((s for s in svcs if s.startswith("node-")), key=lambda s: int(s.split("-")[1]))
    containers = {}
    for svc in svcs:
        cid = _run(base + ["ps", "-q", svc], env=env).stdout.strip()
        name = _run(["docker", "inspect", "-f", "{{.Name}}", cid]).stdout.strip().lstrip("/") if cid else None
        containers[svc] = name
    training = sum(1 for s in nodes if "--training-nodes" in svcs[s].get("command", []))

    def host_url(svc: str, target: int) -> str:
        for p in svcs[svc].get("ports", []):
            if int(p["target"]) == target:
                return f"http://{p.get('host_ip') or '127.0.0.1'}:{p['published']}"
        raise ComposeError(f"service {svc} publishes no port {target}")

    state = {
        "mode": "compose", "project": project, "compose_file": str(COMPOSE_FILE), "profiles": extras,
        "env": {k: v for k, v in (env or os.environ).items() if k.startswith("GPUOBS_")},
        "run_dir": str(run_dir.resolve()), "profile": profile,
        "nodes": len(nodes), "training_nodes": training,
        "hostnames": [svcs[s]["hostname"] for s in nodes],
        "containers": [containers[s] for s in nodes],
        "components": {svc: {"container": name} for svc, name in containers.items()},
        "urls": ({"prometheus": host_url("prometheus", 9090), "alertmanager": host_url("pager", 9093),
                  "pager": host_url("pager", 9097)} if topology == "single" else
                 {"prometheus": host_url("victoria-metrics", 8428), "alertmanager": "",
                  "pager": host_url("pager", 9097)}),
        "topology": topology,
    }
    atomic_write(run_dir / STATE_FILE, json.dumps(state, indent=2) + "\n")
    return state


def load_state(run_dir: Path) -> dict | None:
    """``<run_dir>/compose.json``, or None if there is none. Raises ComposeError if it is damaged."""
    path = run_dir / STATE_FILE
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        if state.get("mode") != "compose" or not isinstance(state.get("containers"), list):
            raise ValueError("not a compose state file")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise ComposeError(f"{path} is damaged ({exc}); delete it if no compose stack runs") from None
    return state


def load_stack_state(run_dir: Path) -> StackState | None:
    """``<run_dir>/compose.json`` as a :class:`~gpuobs.stack.state.StackState` (mode ``compose``), or None.

    Raises ComposeError if it is damaged."""
    doc = load_state(run_dir)
    if doc is None:
        return None
    if doc.get("topology", "single") != "single":
        raise ComposeError(f"{run_dir / STATE_FILE} records the compose profile {doc['topology']}: drills and reports "
                           "run on the single compose stack or the native HA topology (make up-ha); its members "
                           "publish no port")
    try:
        u = doc["urls"]
        return StackState(run_dir=str(doc["run_dir"]), mode="compose", containers=[str(c) for c in doc["containers"]],
                          urls=StackUrls(prometheus=u["prometheus"], alertmanager=u["alertmanager"], pager=u["pager"],
                                         nodes=[]),
                          hostnames=[str(h) for h in doc["hostnames"]], token_file="", nodes=int(doc["nodes"]),
                          training_nodes=int(doc.get("training_nodes", 0)), profile=str(doc.get("profile", "default")))
    except (KeyError, TypeError, ValueError) as exc:
        raise ComposeError(f"{run_dir / STATE_FILE} is damaged ({exc}); delete it if no compose stack runs") from None


def _env_of(state: dict) -> dict:
    return {**os.environ, **state.get("env", {})}


def down(run_dir: Path, volumes: bool = False, out=sys.stdout) -> None:
    """Stop and remove the stack's containers and networks (and its volumes with ``volumes``)."""
    state = load_state(run_dir)
    project = state["project"] if state else DEFAULT_PROJECT
    env = _env_of(state) if state else None
    cmd = compose_cmd(project, *OPTIONAL_PROFILES, HA_PROFILE) + ["down", "--remove-orphans", "--timeout", "10"]
    _run(cmd + (["--volumes"] if volumes else []), env=env, timeout=180)
    (run_dir / STATE_FILE).unlink(missing_ok=True)
    print(f"compose: project {project} stopped" + (" and its volumes removed" if volumes else
                                                   " (volumes kept; `down -v` deletes them)"), file=out)


def status(run_dir: Path) -> str:
    state = load_state(run_dir)
    project = state["project"] if state else DEFAULT_PROJECT
    return _run(compose_cmd(project, *OPTIONAL_PROFILES, HA_PROFILE) + ["ps", "-a"],
                env=_env_of(state) if state else None).stdout


class ComposeAdmin(AdminClient):
    """:class:`AdminClient` for a node container: each call is ``docker exec`` of one HTTP request to
    the admin API on the container's loopback, as the gpuobs user (who owns the token). The ``down``
    fault is the container stopping (``docker stop``); clearing it starts the container again."""

    STOPPED_ID = "container-stopped"

    def __init__(self, container: str, timeout_s: float = 30.0):
        self.container = container
        self.base_url = f"docker-exec://{container}"
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        argv = ["docker", "exec", "-u", NODE_USER, self.container, "python3", "-c", _ADMIN_CALL,
                method, NODE_ADMIN_URL + path, NODE_TOKEN_FILE, json.dumps(body) if body is not None else ""]
        try:
            proc = _run(argv, timeout=self.timeout_s, check=False)
        except ComposeError as exc:
            raise AdminError(0, f"cannot reach {self.container}: {exc}") from None
        try:
            reply = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise AdminError(0, f"cannot reach the admin API in {self.container}: "
                                f"{(proc.stderr or proc.stdout).strip()[-300:]}") from None
        doc, code = reply["body"], reply["status"]
        if code >= 400:
            raise AdminError(code, doc.get("error", f"HTTP {code}"), doc.get("field"))
        return doc

    def inject(self, body: dict) -> dict:
        if body.get("kind") == "down":
            _run(["docker", "stop", "--time", "5", self.container], timeout=60)
            return {"id": self.STOPPED_ID, "kind": "down", "gpu": None, "params": {"container": self.container}}
        return super().inject(body)

    def clear(self, fault_id: str) -> dict:
        if fault_id == self.STOPPED_ID:
            _run(["docker", "start", self.container], timeout=60)
            return {"id": fault_id, "kind": "down"}
        return super().clear(fault_id)
