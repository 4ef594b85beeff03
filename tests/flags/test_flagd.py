"""The flagd-format flag file: shape, node targeting through flagd's own evaluator, kill switch, locking."""

from __future__ import annotations

import json
import threading

import pytest

from gpuobs.flags.flagd import SCHEMA_URL, FlagFile, FlagFileError

HOSTS = ["gpu-node-00", "gpu-node-01", "gpu-node-02"]


@pytest.fixture
def ff(tmp_path):
    f = FlagFile(tmp_path / "flags.json")
    f.ensure(["spec_decode", "kv_policy_v2"])
    return f


def test_new_file_is_flagd_json_with_every_flag_off(ff):
    doc = json.loads(ff.path.read_text())
    assert doc["$schema"] == SCHEMA_URL
    spec = doc["flags"]["spec_decode"]
    assert spec["state"] == "ENABLED" and spec["defaultVariant"] == "off"
    assert spec["variants"] == {"on": True, "off": False}
    assert spec["targeting"] == {"if": [{"in": [{"var": "targetingKey"}, []]}, "on", "off"]}
    assert not any(ff.enabled("spec_decode", h) for h in HOSTS)


def test_set_hosts_targets_exactly_those_nodes_and_returns_the_previous_set(ff):
    assert ff.set_hosts("spec_decode", on=["gpu-node-01"]) == []
    assert [ff.enabled("spec_decode", h) for h in HOSTS] == [False, True, False]
    assert ff.set_hosts("spec_decode", on=["gpu-node-00"], off=["gpu-node-01"]) == ["gpu-node-01"]
    assert ff.hosts("spec_decode") == ["gpu-node-00"]
    assert not ff.enabled("spec_decode", "gpu-node-99")  # a node nobody listed runs with the flag off
    assert not ff.enabled("kv_policy_v2", "gpu-node-00")  # other flags untouched


def test_ensure_keeps_existing_state_and_adds_missing_flags(ff):
    ff.set_hosts("spec_decode", on=HOSTS)
    ff.ensure(["spec_decode", "kv_policy_v2", "new_flag"])
    assert ff.hosts("spec_decode") == HOSTS and ff.hosts("new_flag") == []


def test_kill_switch_turns_the_flag_off_everywhere_and_blocks_enabling(ff):
    ff.set_hosts("spec_decode", on=HOSTS[:2])
    assert ff.kill("spec_decode", "INC-42") == HOSTS[:2]
    assert ff.killed("spec_decode") and ff.hosts("spec_decode") == []
    assert not any(ff.enabled("spec_decode", h) for h in HOSTS)
    with pytest.raises(FlagFileError, match="killed"):
        ff.set_hosts("spec_decode", on=["gpu-node-00"])
    ff.set_hosts("spec_decode", off=["gpu-node-00"])  # turning off stays allowed
    ff.clear_kill("spec_decode", "new rollout")
    assert not ff.killed("spec_decode")
    ff.set_hosts("spec_decode", on=["gpu-node-00"])
    assert ff.enabled("spec_decode", "gpu-node-00")


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d["flags"]["spec_decode"].update(defaultVariant="on"), "defaultVariant"),
    (lambda d: d["flags"]["spec_decode"].update(targeting={"fractional": []}), "targeting"),
    (lambda d: d["flags"]["spec_decode"].update(variants={"a": 1}), "variants"),
    (lambda d: d.update(flags=[]), "'flags'"),
])
def test_a_hand_edited_file_outside_the_managed_shape_is_refused_by_name(ff, mutate, needle):
    doc = json.loads(ff.path.read_text())
    mutate(doc)
    ff.path.write_text(json.dumps(doc))
    with pytest.raises(FlagFileError, match=needle):
        ff.set_hosts("spec_decode", on=["gpu-node-00"])


def test_unknown_flag_and_missing_file_name_the_problem(ff, tmp_path):
    with pytest.raises(FlagFileError, match="'nope' is not in"):
        ff.hosts("nope")
    with pytest.raises(FlagFileError, match="does not exist"):
        FlagFile(tmp_path / "absent.json").read()
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(FlagFileError, match="cannot read it as JSON"):
        FlagFile(tmp_path / "bad.json").read()


def test_concurrent_writers_lose_no_update(ff):
    hosts = [f"gpu-node-{i:02d}" for i in range(40)]
    threads = [threading.Thread(target=ff.set_hosts, args=("spec_decode",), kwargs={"on": [h]}) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ff.hosts("spec_decode") == sorted(hosts)
