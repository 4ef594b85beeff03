"""OpenFeature evaluation of the flag file through flagd's in-process file provider (no flag server)."""

from __future__ import annotations

import time

import pytest

from gpuobs.flags.evaluate import FlagEvaluator
from gpuobs.flags.flagd import FlagFile, FlagFileError


def _until(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_evaluates_by_node_identity_and_sees_flips_and_the_kill(tmp_path):
    ff = FlagFile(tmp_path / "flags.json")
    ff.ensure(["spec_decode"])
    ev = FlagEvaluator(ff.path, poll_ms=50)
    try:
        assert not ev.enabled("spec_decode", "gpu-node-00") and ev.last_error is None
        ff.set_hosts("spec_decode", on=["gpu-node-00"])
        assert _until(lambda: ev.enabled("spec_decode", "gpu-node-00"))
        assert not ev.enabled("spec_decode", "gpu-node-01")
        ff.kill("spec_decode", "test")
        assert _until(lambda: not ev.enabled("spec_decode", "gpu-node-00"))
    finally:
        ev.close()


def test_unknown_flag_evaluates_off_with_the_reason(tmp_path):
    ff = FlagFile(tmp_path / "flags.json")
    ff.ensure(["spec_decode"])
    ev = FlagEvaluator(ff.path)
    try:
        assert ev.enabled("nope", "gpu-node-00") is False
        assert "FLAG_NOT_FOUND" in ev.last_error
    finally:
        ev.close()


def test_a_missing_file_is_a_clear_error_not_every_flag_silently_off(tmp_path):
    with pytest.raises(FlagFileError, match="does not exist"):
        FlagEvaluator(tmp_path / "absent.json")
