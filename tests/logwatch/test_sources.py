"""Followers: file (rotation, truncation), /dev/kmsg (seq, EPIPE overrun, boot id; fake ring buffer),
journalctl JSON (cursor; fake subprocess), the simulated node's endpoint; each resumes from its
saved position without loss or duplicates."""

from __future__ import annotations

import errno
import io
import json
import os

import pytest
import requests

from gpuobs.logwatch import sources as src

TOKEN = "test-token-123"


def drain(s, n: int = 10000) -> list[str]:
    out = []
    while True:
        b = s.read_batch(n)
        if not b.lines:
            return out
        out += b.lines


# ---- file -------------------------------------------------------------------------------------
def test_file_partial_line_waits_for_its_newline(tmp_path):
    f = tmp_path / "kern.log"
    f.write_text("a\nb\nhalf")
    s = src.FileSource(f)
    s.start(None)
    assert drain(s) == ["a", "b"]
    with open(f, "a") as fh:
        fh.write(" line\nc\n")
    assert drain(s) == ["half line", "c"]


def test_file_rotation_and_truncation(tmp_path):
    f = tmp_path / "kern.log"
    f.write_text("1\n2\n")
    s = src.FileSource(f)
    s.start(None)
    assert drain(s) == ["1", "2"]
    with open(f, "a") as fh:
        fh.write("3\n")
    os.rename(f, tmp_path / "kern.log.1")  # logrotate: rename, then a new file
    f.write_text("4\n")
    assert drain(s) == ["3"]  # the rest of the old file first
    assert drain(s) == ["4"]
    f.write_text("")  # copytruncate: same inode, now shorter than our offset
    assert drain(s) == []
    f.write_text("x\n")
    assert drain(s) == ["x"]


def test_file_restart_resumes_in_the_rotated_file(tmp_path):
    f = tmp_path / "kern.log"
    f.write_text("1\n2\n")
    s = src.FileSource(f)
    s.start(None)
    assert drain(s) == ["1", "2"]
    pos = s.position
    s.close()
    with open(f, "a") as fh:
        fh.write("3\n")  # written while the agent was down ...
    os.rename(f, tmp_path / "kern.log.1")  # ... and rotated away
    f.write_text("4\n5\n")
    s2 = src.FileSource(f)
    s2.start(pos)
    assert drain(s2) + drain(s2) == ["3", "4", "5"]


def test_file_start_at_end_and_missing_file(tmp_path):
    f = tmp_path / "kern.log"
    s = src.FileSource(f, "end")
    s.start(None)
    with pytest.raises(src.SourceError, match="no such file"):
        s.read_batch()
    f.write_text("old\n")
    s2 = src.FileSource(f, "end")
    s2.start(None)
    with open(f, "a") as fh:
        fh.write("new\n")
    assert drain(s2) == ["new"]


# ---- /dev/kmsg ----------------------------------------------------------------------------------
class FakeKmsg(src.KmsgOps):
    """A /dev/kmsg ring buffer of ``size`` records with the kernel's reader semantics."""

    def __init__(self, size: int = 8, boot: str = "boot-a"):
        self.records: list[tuple[int, bytes]] = []
        self.size = size
        self.seq = 0
        self.boot = boot
        self.pos = 0  # next seq this reader will get

    def log(self, msg: str, prio: int = 3) -> int:
        rec = f"{prio},{self.seq},{self.seq * 1000},-;{msg}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:2b:00.0\n".encode()
        self.records.append((self.seq, rec))
        self.records = self.records[-self.size:]
        self.seq += 1
        return self.seq - 1

    def open(self, path):
        return 3

    def seek_start(self, fd):
        self.pos = self.records[0][0] if self.records else self.seq

    def seek_end(self, fd):
        self.pos = self.seq

    def read(self, fd):
        first = self.records[0][0] if self.records else self.seq
        if self.pos < first:
            self.pos = first
            raise OSError(errno.EPIPE, "Broken pipe")
        for seq, rec in self.records:
            if seq == self.pos:
                self.pos += 1
                return rec
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    def close(self, fd):
        pass

    def boot_id(self):
        return self.boot


def test_kmsg_reads_message_only_and_skips_userspace_records():
    k = FakeKmsg()
    k.log("NVRM: Xid (PCI:0000:2b:00): 48, pid=1, name=x, DBE")
    k.log("NVRM: Xid (PCI:0000:2b:00): 13, spoofed", prio=(1 << 3) | 4)  # facility LOG_USER
    s = src.KmsgSource(start_at="beginning", ops=k)
    s.start(None)
    assert drain(s) == ["NVRM: Xid (PCI:0000:2b:00): 48, pid=1, name=x, DBE"]
    assert s.position == {"boot_id": "boot-a", "seq": 1}


def test_kmsg_overrun_epipe_counts_lost_records_and_continues():
    k = FakeKmsg(size=4)
    s = src.KmsgSource(start_at="beginning", ops=k)
    for i in range(2):
        k.log(f"line {i}")
    s.start(None)
    assert s.read_batch().lines == ["line 0", "line 1"]
    for i in range(2, 12):  # 10 new records into a 4-record ring: 6 are overwritten unread
        k.log(f"line {i}")
    b = s.read_batch()
    assert b.lines == ["line 8", "line 9", "line 10", "line 11"]
    assert b.lost == 6


def test_kmsg_restart_same_boot_no_loss_no_duplicates_new_boot_rereads():
    k = FakeKmsg(size=100)
    for i in range(3):
        k.log(f"line {i}")
    s = src.KmsgSource(start_at="end", ops=k)
    s.start(None)
    assert drain(s) == []  # started at the end
    s0 = src.KmsgSource(start_at="end", ops=k)  # restarted before reading any record: same boot, not a new one
    s0.start(s.position)
    b0 = s0.read_batch()
    assert b0.lines == [] and not b0.new_boot
    k.log("line 3")
    assert drain(s) == ["line 3"]
    pos = s.position
    s.close()
    k.log("line 4")  # while we were down
    s2 = src.KmsgSource(start_at="end", ops=k)
    s2.start(pos)
    assert drain(s2) == ["line 4"]
    pos = s2.position
    k2 = FakeKmsg(boot="boot-b")  # reboot: a new boot id, a fresh buffer
    k2.log("after reboot")
    s3 = src.KmsgSource(start_at="end", ops=k2)
    s3.start(pos)
    b = s3.read_batch()
    assert b.new_boot and b.lines == ["after reboot"]


# ---- journalctl -----------------------------------------------------------------------------------
class FakeProc:
    def __init__(self, lines: list[bytes], rc: int = 0, stderr: bytes = b""):
        self.stdout = io.BytesIO(b"".join(lines))
        self.stderr = io.BytesIO(stderr)
        self.rc = rc

    def poll(self):
        return self.rc

    def terminate(self):
        pass

    def wait(self, timeout=None):
        return self.rc


def jline(cursor: str, msg, boot: str = "b1") -> bytes:
    return (json.dumps({"__CURSOR": cursor, "MESSAGE": msg, "_BOOT_ID": boot, "__REALTIME_TIMESTAMP": "1"}) + "\n").encode()


def test_journal_cursor_resume_and_exit():
    calls = []
    feeds = [[jline("c1", "NVRM: Xid (PCI:0000:2b:00): 48, DBE"), jline("c2", list(b"NVRM: bytes \xff")),
              b"not json\n"],
             [jline("c3", "after restart")]]

    def popen(argv):
        calls.append(argv)
        return FakeProc(feeds[len(calls) - 1], rc=1, stderr=b"journal gone")

    s = src.JournalSource(popen=popen)
    s.start(None)
    assert "--lines=0" in calls[0] and not any(a.startswith("--after-cursor") for a in calls[0])
    got, bad = [], 0
    for _ in range(50):
        try:
            b = s.read_batch()
        except src.SourceError as exc:
            assert "exited with status 1: journal gone" in str(exc)
            break
        got += b.lines
        bad += b.bad
    assert got == ["NVRM: Xid (PCI:0000:2b:00): 48, DBE", "NVRM: bytes \ufffd"] and bad == 1
    assert s.position == {"cursor": "c2", "boot_id": "b1"}
    s2 = src.JournalSource(popen=popen)
    s2.start(s.position)
    assert "--after-cursor=c2" in calls[1]
    for _ in range(50):
        b = s2.read_batch()
        if b.lines:
            assert b.lines == ["after restart"]
            break


# ---- simulated node -------------------------------------------------------------------------------
def test_sim_endpoint_follow_resume_and_reboot(node_server):
    url, node = node_server
    s = src.SimSource(url, TOKEN)
    s.start(None)
    assert s.read_batch().lines == []
    requests.post(f"{url}/admin/faults", json={"kind": "xid", "gpu": 1, "code": 48},
                  headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).raise_for_status()
    first = s.read_batch().lines
    assert len(first) == 2 and "GPU at PCI" in first[0] and "): 48, pid=" in first[1]
    pos = s.position
    requests.post(f"{url}/admin/faults", json={"kind": "xid", "gpu": 1, "code": 48},
                  headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).raise_for_status()
    s2 = src.SimSource(url, TOKEN)
    s2.start(pos)
    b = s2.read_batch()
    assert len(b.lines) == 1 and "): 48, pid=" in b.lines[0] and not b.new_boot
    with node.lock:  # the node "reboots": new boot id, empty log
        node.boot_id, node.kernel_log = "rebooted", ["[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."]
    b = s2.read_batch()
    assert b.new_boot and b.lines == node.kernel_log
    bad = src.SimSource(url, "wrong")
    with pytest.raises(src.SourceError, match="HTTP 401"):
        bad.read_batch()
    r = requests.get(f"{url}/admin/kernel-log", params={"from": "x"}, headers={"Authorization": f"Bearer {TOKEN}"},
                     timeout=5)
    assert r.status_code == 400 and r.json()["field"] == "from"
