"""Compose mode's decisions without a Docker engine: `make up` uses compose only when the engine, the
Compose plugin and every required image are there, and otherwise says why in one line (a fake
``docker`` on PATH plays the engine); the drills' ComposeAdmin turns admin-API replies and failures of
``docker exec`` into AdminError like the HTTP client does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuobs.promapi.exporter_admin import AdminError
from gpuobs.stack import compose

FAKE_DOCKER = r"""#!/bin/sh
# Fake docker: FAKE_INFO_RC, FAKE_COMPOSE_RC, FAKE_MISSING (space-separated images), FAKE_EXEC_OUT/RC.
case "$1" in
  info) exit "${FAKE_INFO_RC:-0}" ;;
  image) for m in $FAKE_MISSING; do [ "$3" = "$m" ] && exit 1; done; exit 0 ;;
  exec) printf '%s\n' "$FAKE_EXEC_OUT"; echo "$FAKE_EXEC_ERR" >&2; exit "${FAKE_EXEC_RC:-0}" ;;
  compose)
    [ "$2" = version ] && exit "${FAKE_COMPOSE_RC:-0}"
    cat <<'JSON'
{"services": {"node-0": {"image": "gpuobs:0.1.0"}, "pager": {"image": "gpuobs:0.1.0"},
 "prometheus": {"image": "gpuobs-prometheus:bookworm"}, "alertmanager": {"image": "gpuobs-alertmanager:bookworm"},
 "grafana": {"image": "grafana/grafana-oss:11.6.1"}, "jaeger": {"image": "jaegertracing/all-in-one:1.62.0"}}}
JSON
    ;;
esac
"""


@pytest.fixture
def fake_docker(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return monkeypatch


def test_no_docker_command_means_native(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert compose.check() == (False, "no Docker engine (no docker command)", [])


def test_no_engine_means_native(fake_docker):
    fake_docker.setenv("FAKE_INFO_RC", "1")
    assert compose.check() == (False, "no Docker engine answers", [])


def test_no_compose_plugin_names_make_images(fake_docker):
    fake_docker.setenv("FAKE_COMPOSE_RC", "1")
    ok, why, _ = compose.check()
    assert not ok and "Compose v2 plugin is missing" in why and "make images" in why


def test_missing_images_are_named_with_the_command_that_builds_them(fake_docker):
    fake_docker.setenv("FAKE_MISSING", "gpuobs-prometheus:bookworm grafana/grafana-oss:11.6.1 jaegertracing/all-in-one:1.62.0")
    ok, why, _ = compose.check()
    assert not ok
    assert why == "Docker answers but image(s) gpuobs-prometheus:bookworm are missing: build them with `make images`"


def test_optional_profiles_follow_their_images(fake_docker):
    fake_docker.setenv("FAKE_MISSING", "grafana/grafana-oss:11.6.1")
    assert compose.check() == (True, "Docker, Compose and the images are present", ["jaeger"])


def test_check_command_prints_one_line_and_fails(fake_docker, tmp_path):
    fake_docker.setenv("FAKE_MISSING", "gpuobs:0.1.0")
    r = subprocess.run([sys.executable, "-m", "gpuobs", "compose", "check"], capture_output=True, text=True,
                       env=os.environ.copy(), timeout=60)
    assert r.returncode == 1
    assert r.stdout.splitlines() == ["Docker answers but image(s) gpuobs:0.1.0 are missing: build them with `make images`"]


def test_compose_admin_maps_replies_and_failures(fake_docker):
    admin = compose.ComposeAdmin("gpuobs-node-0-1")
    fake_docker.setenv("FAKE_EXEC_OUT", json.dumps({"status": 201, "body": {"id": "f-1", "kind": "xid"}}))
    assert admin.inject({"kind": "xid", "gpu": 0, "code": 48}) == {"id": "f-1", "kind": "xid"}
    fake_docker.setenv("FAKE_EXEC_OUT", json.dumps({"status": 400, "body": {"error": "bad gpu", "field": "gpu"}}))
    with pytest.raises(AdminError) as exc:
        admin.inject({"kind": "xid", "gpu": 99})
    assert (exc.value.status, exc.value.field, str(exc.value)) == (400, "gpu", "bad gpu")
    fake_docker.setenv("FAKE_EXEC_OUT", "")
    fake_docker.setenv("FAKE_EXEC_ERR", "Error: No such container: gpuobs-node-0-1")
    fake_docker.setenv("FAKE_EXEC_RC", "1")
    with pytest.raises(AdminError) as exc:
        admin.list()
    assert exc.value.status == 0 and "No such container" in str(exc.value)


def test_damaged_state_file_is_a_clear_error(tmp_path):
    assert compose.load_state(tmp_path) is None
    (tmp_path / "compose.json").write_text("{not json")
    with pytest.raises(compose.ComposeError, match="compose.json is damaged"):
        compose.load_state(tmp_path)
    (tmp_path / "compose.json").write_text(json.dumps({"mode": "native"}))
    with pytest.raises(compose.ComposeError, match="not a compose state file"):
        compose.load_state(tmp_path)


def test_the_admin_call_script_runs_with_the_images_python():
    """The snippet executed in node containers is valid Python (compiled here, run there)."""
    compile(compose._ADMIN_CALL, "<admin-call>", "exec")
    assert Path(compose.COMPOSE_FILE).is_file()
