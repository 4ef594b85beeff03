"""With the stack down, every command that talks to Prometheus, Alertmanager, the pager, the remediation
controller or a node's admin API says so in one line naming the component, the URL and the fix, not
urllib3's ``HTTPConnectionPool(...): Max retries exceeded ... NewConnectionError(...)`` (issue 29)."""

from __future__ import annotations

import socket

import pytest

from gpuobs.cli import run as cli_run
from gpuobs.core.reach import reason, unreachable


@pytest.fixture
def closed_url():
    """http://127.0.0.1:<port> where nothing listens (bound, then closed: connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


#: (argv with {u} for the closed URL and {d} for an empty run dir, component the error names, its flag)
COMMANDS = [
    ("incident list --pager-url {u} --run-dir {d}", "the pager", "--pager-url"),
    ("incident show 1 --pager-url {u} --run-dir {d}", "the pager", "--pager-url"),
    ("incident ack 1 --pager-url {u} --run-dir {d}", "the pager", "--pager-url"),
    ("incident silence 1 --comment c --pager-url {u} --alertmanager-url {u} --run-dir {d}", "the pager", "--pager-url"),
    ("incident unsilence 1 s1 --pager-url {u} --alertmanager-url {u} --run-dir {d}", "the pager", "--pager-url"),
    ("incident postmortem 1 --pager-url {u} --prometheus {u} --run-dir {d}", "the pager", "--pager-url"),
    ("incident silences --pager-url {u} --alertmanager-url {u} --run-dir {d}", "Alertmanager", "--alertmanager-url"),
    ("doctor --prometheus {u} --timeout 2", "Prometheus", "--prometheus"),
    ("canary analyze --prometheus {u} --canary track=\"canary\" --baseline track=\"baseline\" --retries 0",
     "Prometheus", "--prometheus"),
    ("compat fleet --prometheus {u} --release 2.0.0 --retries 0", "Prometheus", "--prometheus"),
    ("fault list --url {u} --token t", "the node's admin API", "--url"),
    ("fault clear --all --url {u} --token t", "the node's admin API", "--url"),
]


@pytest.mark.parametrize("argv,component,flag", COMMANDS, ids=[c[0].split(" -")[0] for c in COMMANDS])
def test_an_unreachable_server_is_one_line_naming_it_the_url_and_the_fix(argv, component, flag, closed_url,
                                                                         tmp_path, capsys):
    argv = [a.replace("{u}", closed_url).replace("{d}", str(tmp_path / "run")) for a in argv.split()]
    code = cli_run(argv)
    out = capsys.readouterr()
    err = out.err
    assert code != 0, err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    for raw in ("HTTPConnectionPool", "Max retries", "NewConnectionError", "Traceback", "Errno"):
        assert raw not in err, err
    assert f"cannot reach {component} at {closed_url} (connection refused)" in err, err
    assert f"start the stack with `make up` or pass {flag} URL" in err, err


def test_reason_reads_the_wrapped_socket_error():
    """The reason comes from the OS error inside requests' and urllib3's wrappers."""
    import requests

    try:
        requests.get("http://127.0.0.1:1/", timeout=2)
    except requests.RequestException as exc:
        assert reason(exc) == "connection refused"
        assert unreachable("pager", "http://127.0.0.1:1/api/incidents?x=1", exc) == \
            "cannot reach the pager at http://127.0.0.1:1 (connection refused)"
    assert reason(TimeoutError("x")) == "timed out"
