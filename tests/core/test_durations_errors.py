"""The one duration grammar and the one exit-code table."""

from __future__ import annotations

import pytest

from gpuobs.core import errors
from gpuobs.core.durations import DurationError, format_duration, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("2.5", 2.5), ("30s", 30), ("5m", 300), ("1h30m", 5400),
                                               ("1d", 86400), ("1d12h", 129600), ("0.5s", 0.5), (45, 45), (1.5, 1.5)])
def test_accepted(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "m5", "1m1h", "1h1h", "inf", "nan", "-5s", "0", "0s", "1e9999", True, None, "5ms", 10 ** 400])
def test_rejected_names_the_field(text):
    with pytest.raises(DurationError) as ei:
        parse_duration(text, "--stage-timeout")
    assert "--stage-timeout" in str(ei.value) and ei.value.exit_code == errors.EXIT_USAGE


def test_zero_only_when_allowed_and_format():
    assert parse_duration("0s", allow_zero=True) == 0
    assert [format_duration(s) for s in (86400, 3600, 25920, 90, 1.5)] == ["1d", "1h", "432m", "90s", "1.5s"]


def test_the_exit_code_table():
    assert errors.InputError("x").exit_code == 2 and errors.Failure("x").exit_code == 1
    assert errors.BackendError("x").exit_code == errors.EXIT_BACKEND == 4
    assert errors.Inconclusive("x").exit_code == 3 and isinstance(errors.InputError("x"), ValueError)


def test_every_cli_error_uses_one_prefix(capsys):
    from gpuobs.cli import run

    assert run(["rollout", "start", "--run-dir", "/nonexistent-gpuobs", "--version", "1.5.0", "--stage-timeout", "1d"]) == 2
    assert capsys.readouterr().err.startswith("gpuobs rollout: error: ")
    assert run(["rules", "slo", "--period", "1x"]) == 2
    assert capsys.readouterr().err.startswith("gpuobs rules: error: ")
