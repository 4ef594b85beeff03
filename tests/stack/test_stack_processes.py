"""``stack down``/``status``/``restart`` find a component by its recorded argv and ports, not only the
recorded pid (issue 12). Stand-in components: small Python servers listening on the stack's ports."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuobs.stack import state as state_file
from gpuobs.stack import supervisor as sv
from gpuobs.stack.ports import free_port_range, port_free
from gpuobs.stack.state import Component, StackState, StackUrls

SERVE = ("import http.server, sys\n"
         "class H(http.server.BaseHTTPRequestHandler):\n"
         "    def do_GET(self):\n"
         "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers(); self.wfile.write(b'ok')\n"
         "    def log_message(self, *a): pass\n"
         "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while port_free(port):
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.05)


@pytest.fixture
def fake_stack(tmp_path):
    base = free_port_range(4)
    argv = {"pager": [sys.executable, "-c", SERVE, str(base)],
            "alertmanager": [sys.executable, "-c", SERVE, str(base + 1)]}
    procs = {name: _start(a) for name, a in argv.items()}
    for p in (base, base + 1):
        _wait_listening(p)
    state = StackState(run_dir=str(tmp_path), started_at=time.time(),
                       ports={"prometheus": base + 3, "alertmanager": base + 1, "pager": base, "node_base": base + 2,
                              "engine_base": base + 2, "grafana": base + 3},
                       nodes=1, gpus=1, seed=1, training_nodes=1, profile="default", hostnames=["gpu-node-00"],
                       token_file=str(tmp_path / "admin-token"),
                       urls=StackUrls(prometheus=f"http://127.0.0.1:{base + 3}", alertmanager=f"http://127.0.0.1:{base + 1}",
                                      pager=f"http://127.0.0.1:{base}", nodes=[]),
                       components={n: Component(p.pid, argv[n], str(tmp_path / f"{n}.log")) for n, p in procs.items()})
    state_file.save(state)
    extra: list[subprocess.Popen] = []
    yield tmp_path, state, procs, extra, base
    for p in [*procs.values(), *extra]:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_hand_restarted_component_is_running_and_down_stops_it(fake_stack):
    run, state, procs, extra, base = fake_stack
    procs["pager"].kill()
    procs["pager"].wait()
    again = _start(state.components["pager"].argv)  # restarted by hand, same command line
    extra.append(again)
    _wait_listening(base)
    rows = {r["component"]: r for r in sv.status(run)}
    assert rows["pager"]["running"] and rows["pager"]["pid"] == again.pid
    assert rows["pager"]["recorded_pid"] == procs["pager"].pid
    out = io.StringIO()
    assert sv.down(run, out=out) == 2
    assert again.wait(timeout=10) is not None and procs["alertmanager"].wait(timeout=10) is not None
    assert port_free(base) and port_free(base + 1)


def test_down_finds_a_port_holder_of_the_same_program_but_spares_others(fake_stack):
    run, state, procs, extra, base = fake_stack
    procs["alertmanager"].kill()
    procs["alertmanager"].wait()
    # Same program (python) on the component's port with a different argv: found through the port.
    variant = _start([sys.executable, "-c", SERVE + "# variant\n", str(base + 1)])
    # A stranger: same program, a port the stack does not own.
    stranger = _start([sys.executable, "-c", SERVE, str(base + 3 + 100)])
    extra += [variant, stranger]
    _wait_listening(base + 1)
    _wait_listening(base + 103)
    assert sv.find_processes(state, "alertmanager") == [variant.pid]
    sv.down(run, out=io.StringIO())
    assert variant.wait(timeout=10) is not None
    assert stranger.poll() is None, "a process outside the stack was signalled"


def test_restart_starts_the_recorded_argv_and_updates_the_pid(fake_stack):
    run, state, procs, extra, base = fake_stack
    old = procs["pager"].pid
    new = sv.restart(run, "pager", out=io.StringIO(), timeout_s=20)
    assert new != old and procs["pager"].wait(timeout=10) is not None
    assert state_file.load(run).components["pager"].pid == new
    assert sv.find_processes(state_file.load(run), "pager") == [new]
    with pytest.raises(sv.StackError, match="unknown component"):
        sv.restart(run, "grafana", out=io.StringIO())
    sv.down(run, out=io.StringIO())
    assert port_free(base)


def test_stack_files_are_private(tmp_path):
    with sv.private_files():
        sv._make_private(tmp_path / "run")
        (tmp_path / "run" / "sub").mkdir()
        state_file.save(StackState(run_dir=str(tmp_path / "run"), started_at=0.0, ports={}, nodes=1, gpus=1, seed=1,
                                   training_nodes=0, profile="default", hostnames=[], token_file="",
                                   urls=StackUrls("", "", "", [])))
    assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "run" / "sub").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(Path(tmp_path / "run" / "stack.json")).st_mode) == 0o600


def test_cli_restart_needs_a_component_and_down_refuses_one(tmp_path, capsys):
    from gpuobs.cli import run as cli

    assert cli(["stack", "restart", "--run-dir", str(tmp_path / "r")]) == 2
    assert "needs a COMPONENT" in capsys.readouterr().err
    assert cli(["stack", "down", "pager", "--run-dir", str(tmp_path / "r")]) == 2
    assert cli(["stack", "restart", "pager", "--run-dir", str(tmp_path / "r")]) == 2
    assert "no stack running" in capsys.readouterr().err


def test_a_bad_environment_default_is_checked_like_its_flag(tmp_path, capsys, monkeypatch):
    """GPUOBS_PROFILE=fast (argparse checks choices of a flag, not of an environment default): one line
    naming the flag and the variable, exit 2, nothing written (it was a traceback and a half-written run
    directory)."""
    from gpuobs.cli import run as cli_run

    monkeypatch.setenv("GPUOBS_PROFILE", "fast")
    run_dir = tmp_path / "run"
    assert cli_run(["stack", "up", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "GPUOBS_PROFILE" in err and "default, drill" in err and err.count("\n") == 1 and "Traceback" not in err
    assert not run_dir.exists()


def test_up_over_a_running_stack_is_refused_first_with_the_callers_stop_hint(fake_stack, capsys):
    """A second `make up`: the refusal comes before any "starting" line (``stack up --check`` runs first)
    and tells to run `make down`, not `gpuobs stack down --run-dir ...` (issue 29)."""
    from gpuobs.cli import run as cli_run

    run = fake_stack[0]
    before = sorted(p.name for p in run.iterdir())
    assert cli_run(["stack", "up", "--check", "--run-dir", str(run)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and f"run `gpuobs stack down --run-dir {run}` first" in out.err
    for argv in (["--check"], []):  # the check alone, and `stack up` itself: refused before it starts anything
        assert cli_run(["stack", "up", *argv, "--stop-hint", "make down", "--run-dir", str(run)]) == 2
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1, out
        assert f"a stack is already running from {run}; run `make down` first" in out.err
    assert sorted(p.name for p in run.iterdir()) == before


def test_a_stopped_run_dir_passes_the_check_without_writing(tmp_path, capsys):
    from gpuobs.cli import run as cli_run

    assert cli_run(["stack", "up", "--check", "--run-dir", str(tmp_path / "run")]) == 0
    assert "no stack runs from" in capsys.readouterr().out and not (tmp_path / "run").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("target", ["up", "up-ha"])
def test_make_up_checks_before_it_says_it_starts(target, tmp_path):
    """`make -n` prints the recipe without running it: the `--check` with the `make down` hint comes
    before the run dir is written and before "starting the native stack"."""
    root = Path(__file__).resolve().parents[2]
    lines = subprocess.run(["make", "-n", target, f"RUN_DIR={tmp_path / 'run'}"], cwd=root, capture_output=True,
                           text=True, timeout=60, check=True).stdout.splitlines()
    check = next(i for i, ln in enumerate(lines) if "stack up" in ln and "--check" in ln)
    assert '--stop-hint "make down"' in lines[check]
    assert all("starting the native stack" not in ln and "mode" not in ln and "mkdir" not in ln
               for ln in lines[:check])
    assert any("--stop-hint \"make down\"" in ln and "--check" not in ln for ln in lines[check + 1:])
    assert not (tmp_path / "run").exists()
