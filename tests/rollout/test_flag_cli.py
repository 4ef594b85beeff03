"""``gpuobs flag``: kill switch, status, usage errors, mutual exclusion with release rollouts."""

from __future__ import annotations

import json

from gpuobs.cli import run
from gpuobs.flags.flagd import FlagFile
from gpuobs.rollout.model import RolloutSpec
from gpuobs.rollout.store import RolloutRecord, RolloutStore
from tests.rollout.test_rollout_resume import flag_run  # noqa: F401  (fixture)


def test_kill_turns_the_flag_off_everywhere_and_status_shows_it(flag_run, capsys):  # noqa: F811
    run_dir, seen = flag_run
    ff = FlagFile(run_dir / "flags.json")
    ff.set_hosts("spec_decode", on=["gpu-node-00", "gpu-node-02"])
    assert run(["flag", "kill", "spec_decode", "--run-dir", str(run_dir), "--reason", "INC-77"]) == 0
    out = capsys.readouterr().out
    assert "kill switch: spec_decode off on every node" in out and "was on for gpu-node-00, gpu-node-02" in out
    assert "every engine confirmed off" in out
    assert ff.hosts("spec_decode") == [] and ff.killed("spec_decode")
    assert run(["flag", "status", "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "spec_decode: on for 0/3 serving nodes; KILLED: gpuobs flag kill: INC-77" in out
    assert "kv_policy_v2: on for 0/3 serving nodes" in out


def test_usage_errors_name_the_problem(flag_run, capsys):  # noqa: F811
    run_dir, _ = flag_run
    assert run(["flag", "rollout", "nope", "--run-dir", str(run_dir)]) == 2
    assert "gpuobs flag: error: NAME: unknown flag 'nope'; known: spec_decode, kv_policy_v2" in capsys.readouterr().err
    assert run(["flag", "rollout", "spec_decode", "--run-dir", str(run_dir), "--stages", "100%"]) == 2
    assert "must leave a baseline" in capsys.readouterr().err
    assert run(["flag", "kill", "nope", "--run-dir", str(run_dir)]) == 2
    assert "'nope' is not in" in capsys.readouterr().err
    assert run(["flag", "resume", "--run-dir", str(run_dir)]) == 2
    assert "no flag rollout recorded" in capsys.readouterr().err


def test_a_flag_rollout_waits_for_an_unfinished_release_rollout_and_vice_versa(flag_run, capsys):  # noqa: F811
    run_dir, _ = flag_run
    spec = RolloutSpec("1.5.0", "vllm==0.11.0", "12.8", ("gpu-node-00",), (1,))
    store = RolloutStore(run_dir / "rollout.sqlite")
    store.create(RolloutRecord("1.5.0-x", "1.5.0", "Canary", 0, spec.to_dict()))
    store.close()
    assert run(["flag", "rollout", "kv_policy_v2", "--run-dir", str(run_dir)]) == 2
    assert "release rollout 1.5.0-x (Canary) is unfinished" in capsys.readouterr().err
    (run_dir / "rollout.sqlite").unlink()
    flags = RolloutStore(run_dir / "flag.sqlite")
    flags.create(RolloutRecord("kv_policy_v2-x", "kv_policy_v2=on", "Canary", 0, spec.to_dict()))
    flags.close()
    assert run(["rollout", "start", "--version", "1.5.0", "--run-dir", str(run_dir)]) == 2
    assert "flag rollout kv_policy_v2-x (Canary) is unfinished" in capsys.readouterr().err
    assert json.loads((run_dir / "flags.json").read_text())["flags"]["kv_policy_v2"]["targeting"]


def test_pause_and_promote_are_recorded_in_the_flag_store(flag_run, capsys):  # noqa: F811
    run_dir, _ = flag_run
    spec = RolloutSpec("spec_decode=on", "feature flag spec_decode", "", ("gpu-node-00", "gpu-node-01"), (1, 2))
    flags = RolloutStore(run_dir / "flag.sqlite")
    flags.create(RolloutRecord("spec_decode-x", "spec_decode=on", "Canary", 0, spec.to_dict()))
    flags.close()
    base = ["--run-dir", str(run_dir), "--operator", "alice"]
    assert run(["flag", "pause", *base, "--reason", "INC-5 looks related"]) == 0
    assert "flag rollout spec_decode-x: pause requested by alice" in capsys.readouterr().out
    assert run(["flag", "pause", *base, "--reason", "again"]) == 2
    assert "flag rollout spec_decode-x is already paused by alice" in capsys.readouterr().err
    assert run(["flag", "promote", *base, "--reason", "SRE approved"]) == 0
    flags = RolloutStore(run_dir / "flag.sqlite")
    rec = flags.get("spec_decode-x")
    flags.close()
    assert rec.paused["operator"] == "alice" and rec.promote_request["reason"] == "SRE approved"
    assert not (run_dir / "rollout.sqlite").exists()  # release rollouts untouched


def test_flag_status_says_each_assumption_once_in_its_header(tmp_path, capsys):
    from tests.fakes.flag_rollout import flag_rig, fspec
    from tests.fakes.rollout import ASSUMPTION

    r = flag_rig(tmp_path, {1: ["PROMOTE"], 2: ["HOLD", "ROLLBACK"]})
    rec = r.controller.run(r.controller.create(fspec()).id)
    r.store.close()
    capsys.readouterr()
    assert run(["flag", "status", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"Rollout {rec.id}: RolledBack (exit 1)"
    assert lines[1] == "reason: canary analysis ROLLBACK in stage 2/3: ttft: High (+20.0% [+12.0%, +28.0%])"
    assert lines[2] == f"assumption: ttft: {ASSUMPTION}"
    assert out.count(ASSUMPTION) == 1  # three looks over two stages rested on it


def test_a_release_rollout_created_after_the_flag_rollouts_first_check_still_refuses_it(flag_run, capsys,  # noqa: F811
                                                                                          monkeypatch):
    """The start race: a `rollout start` creates its record after `flag rollout` passed its plan's
    checks (each kind has its own run lock). The final check runs under the start lock every kind
    shares, just before the flag rollout would be created: it refuses, and no flag rollout is left."""
    import gpuobs.cli.flag as flag_cli

    run_dir, _ = flag_run
    planned = flag_cli._plan

    def plan_then_a_release_starts(args, interval):
        out = planned(args, interval)
        spec = RolloutSpec("1.5.0", "vllm==0.11.0", "12.8", ("gpu-node-00",), (1,))
        store = RolloutStore(run_dir / "rollout.sqlite")
        store.create(RolloutRecord("1.5.0-race", "1.5.0", "Canary", 0, spec.to_dict()))
        store.close()
        return out

    monkeypatch.setattr(flag_cli, "_plan", plan_then_a_release_starts)
    assert run(["flag", "rollout", "kv_policy_v2", "--run-dir", str(run_dir)]) == 2
    assert "release rollout 1.5.0-race (Canary) is unfinished" in capsys.readouterr().err
    flags = RolloutStore(run_dir / "flag.sqlite")
    try:
        assert flags.latest(active_only=False) is None
    finally:
        flags.close()
