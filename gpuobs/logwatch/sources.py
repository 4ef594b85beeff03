"""Kernel-log followers with a position that survives restarts.

Every source has the same shape: ``start(position)`` (a dict previously returned by ``position``,
or None for a first start), ``read_batch(max_lines) -> Batch`` (non-blocking: the lines available
now, maybe none), ``position`` (JSON-able dict, valid after the last returned batch) and
``close()``. Read failures raise :class:`SourceError`; the agent marks the source down and retries.

* :class:`FileSource`: a plain file (dmesg/syslog capture, replay). Position = (device, inode, byte
  offset of the end of the last complete line). Rotation by rename (``path`` -> ``path.1``) is
  followed: the old file is read to its end, then the new one from 0, also across a restart;
  truncation (copytruncate) restarts at 0.
* :class:`KmsgSource`: ``/dev/kmsg`` (Linux ``Documentation/ABI/testing/dev-kmsg``): one record per
  ``read()``, ``prio,seq,usec,flags[,...];message``, continuation lines start with a space;
  ``EAGAIN`` = nothing new (``O_NONBLOCK``); ``EPIPE`` = the ring buffer overwrote records we had not
  read: the next read returns the oldest record still there, and the gap in ``seq`` is the number
  lost. Position = (``/proc/sys/kernel/random/boot_id``, last seq). Only kernel-facility records
  count (userspace can write to /dev/kmsg but gets facility LOG_USER).
* :class:`JournalSource`: ``journalctl -k -o json --follow`` (one JSON object per line;
  ``MESSAGE`` is a string, or an array of bytes when not valid UTF-8; ``__CURSOR``; ``_BOOT_ID``).
  Position = the cursor of the last processed entry; a restart passes ``--after-cursor``.
* :class:`SimSource`: a simulated node's ``GET /admin/kernel-log?from=N`` (bearer token), which
  answers the lines from N on with ``X-Boot-Id`` and ``X-Kernel-Log-Lines`` headers. Position =
  (boot id, line number).
"""

from __future__ import annotations

import errno
import json
import os
import queue
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import requests

START_AT = ("end", "beginning")
READ_CHUNK = 1 << 20


class SourceError(RuntimeError):
    """The source cannot be read right now (message names the source and the cause)."""


@dataclass
class Batch:
    """Lines read (str, no newline), records lost to an overrun, undecodable records, and whether
    this batch starts a new boot (boot-scoped gauges reset)."""

    lines: list[str] = field(default_factory=list)
    lost: int = 0
    bad: int = 0
    new_boot: bool = False


# ---- file ---------------------------------------------------------------------------------------
class FileSource:
    kind = "file"

    def __init__(self, path: Path, start_at: str = "beginning"):
        if start_at not in START_AT:
            raise ValueError(f"start_at must be one of {', '.join(START_AT)}, got {start_at!r}")
        self.path = Path(path)
        self.start_at = start_at
        self._fh = None
        self._id: tuple[int, int] | None = None
        self._offset = 0

    def describe(self) -> str:
        return f"file {self.path}"

    def _open(self, p: Path, offset: int) -> None:
        self.close()
        self._fh = open(p, "rb")
        st = os.fstat(self._fh.fileno())
        self._id = (st.st_dev, st.st_ino)
        self._offset = min(offset, st.st_size)
        self._fh.seek(self._offset)

    def start(self, position: dict | None) -> None:
        st = _stat(self.path)
        if position:
            want = (int(position["dev"]), int(position["ino"]))
            off = int(position["offset"])
            if st is not None and (st.st_dev, st.st_ino) == want:
                self._open(self.path, off if st.st_size >= off else 0)
                return
            rotated = self.path.with_name(self.path.name + ".1")
            rst = _stat(rotated)
            if rst is not None and (rst.st_dev, rst.st_ino) == want:
                self._open(rotated, off)  # finish the file we were reading when we stopped
                return
            if st is not None:
                self._open(self.path, 0)
            return
        if st is not None:
            self._open(self.path, st.st_size if self.start_at == "end" else 0)

    def read_batch(self, max_lines: int = 10000) -> Batch:
        if self._fh is None:
            if _stat(self.path) is None:
                raise SourceError(f"{self.describe()}: no such file")
            self._open(self.path, 0)
        data = self._fh.read(READ_CHUNK)
        end = data.rfind(b"\n")
        if end >= 0:
            chunk = data[:end]
            self._offset += end + 1
            self._fh.seek(self._offset)
            return Batch(chunk.decode("utf-8", "replace").split("\n"))
        if len(data) == READ_CHUNK:  # one line longer than a chunk: take it as it is
            self._offset += len(data)
            return Batch([data.decode("utf-8", "replace")])
        self._fh.seek(self._offset)
        # Nothing complete: has the file been rotated or truncated under us?
        st = _stat(self.path)
        if st is None:
            return Batch()
        if (st.st_dev, st.st_ino) != self._id:
            tail = data.decode("utf-8", "replace")  # a last line without newline in the old file
            self._open(self.path, 0)
            return Batch([tail] if tail else [])
        if st.st_size < self._offset:
            self._open(self.path, 0)
        return Batch()

    @property
    def position(self) -> dict:
        if self._id is None:
            return {}
        return {"dev": self._id[0], "ino": self._id[1], "offset": self._offset}

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _stat(p: Path):
    try:
        return os.stat(p)
    except OSError:
        return None


# ---- /dev/kmsg ------------------------------------------------------------------------------------
class KmsgOps:
    """The system calls KmsgSource needs (a test replaces them with a fake ring buffer)."""

    def open(self, path: str) -> int:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def read(self, fd: int) -> bytes:
        return os.read(fd, 8192)  # larger than any record (the kernel answers EINVAL to short reads)

    def seek_start(self, fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)  # first record still in the ring buffer

    def seek_end(self, fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_END)  # after the last record: only new ones

    def close(self, fd: int) -> None:
        os.close(fd)

    def boot_id(self) -> str:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


class KmsgSource:
    kind = "kmsg"

    def __init__(self, path: str = "/dev/kmsg", start_at: str = "end", ops: KmsgOps | None = None):
        if start_at not in START_AT:
            raise ValueError(f"start_at must be one of {', '.join(START_AT)}, got {start_at!r}")
        self.path = path
        self.start_at = start_at
        self.ops = ops or KmsgOps()
        self._fd: int | None = None
        self._boot = ""
        self._last: int | None = None
        self._new_boot = False

    def describe(self) -> str:
        return f"kmsg {self.path}"

    def start(self, position: dict | None) -> None:
        try:
            self._boot = self.ops.boot_id()
            self._fd = self.ops.open(self.path)
            same_boot = bool(position) and position.get("boot_id") == self._boot
            if same_boot and position.get("seq") is not None:
                self.ops.seek_start(self._fd)  # skip what we already counted by seq
                self._last = int(position["seq"])
            elif position and not same_boot:
                self.ops.seek_start(self._fd)  # a new boot: everything in the buffer is new to us
                self._new_boot = True
            elif self.start_at == "end":  # first start, or same boot before any record was read
                self.ops.seek_end(self._fd)
            else:
                self.ops.seek_start(self._fd)
        except OSError as exc:
            raise SourceError(f"{self.describe()}: {exc.strerror or exc}") from None

    def read_batch(self, max_lines: int = 10000) -> Batch:
        if self._fd is None:
            raise SourceError(f"{self.describe()}: not open")
        b = Batch(new_boot=self._new_boot)
        self._new_boot = False
        for _ in range(max_lines):
            try:
                rec = self.ops.read(self._fd)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # overrun: the next read returns the oldest record left; seq shows the gap
                if exc.errno == errno.EAGAIN:
                    break
                raise SourceError(f"{self.describe()}: read failed: {exc.strerror or exc}") from None
            if not rec:
                break
            head, sep, rest = rec.partition(b";")
            fields = head.split(b",")
            try:
                prio, seq = int(fields[0]), int(fields[1])
            except (ValueError, IndexError):
                b.bad += 1
                continue
            if not sep:
                b.bad += 1
                continue
            if self._last is not None:
                if seq <= self._last:
                    continue  # counted before the restart
                b.lost += seq - self._last - 1
            self._last = seq
            if prio >> 3 != 0:
                continue  # not the kernel facility
            b.lines.append(rest.split(b"\n", 1)[0].decode("utf-8", "replace"))
        return b

    @property
    def position(self) -> dict:
        return {"boot_id": self._boot, "seq": self._last}

    def close(self) -> None:
        if self._fd is not None:
            self.ops.close(self._fd)
            self._fd = None


# ---- journalctl ----------------------------------------------------------------------------------
class JournalSource:
    kind = "journal"

    def __init__(self, journalctl: str = "journalctl", start_at: str = "end", popen=None):
        if start_at not in START_AT:
            raise ValueError(f"start_at must be one of {', '.join(START_AT)}, got {start_at!r}")
        self.journalctl = journalctl
        self.start_at = start_at
        self.popen = popen or (lambda argv: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                              stdin=subprocess.DEVNULL))
        self._proc = None
        self._q: queue.Queue = queue.Queue(maxsize=100000)
        self._cursor: str | None = None
        self._boot: str | None = None
        self._exited: str | None = None

    def describe(self) -> str:
        return f"journal ({self.journalctl} -k)"

    def argv(self) -> list[str]:
        argv = [self.journalctl, "-k", "-o", "json", "--follow", "--no-pager"]
        if self._cursor:
            argv.append(f"--after-cursor={self._cursor}")
        elif self.start_at == "end":
            argv.append("--lines=0")
        else:
            argv.append("--lines=all")
        return argv

    def start(self, position: dict | None) -> None:
        if position:
            self._cursor = position.get("cursor") or None
            self._boot = position.get("boot_id") or None
        self._spawn()

    def _spawn(self) -> None:
        try:
            self._proc = self.popen(self.argv())
        except OSError as exc:
            raise SourceError(f"{self.describe()}: cannot start: {exc.strerror or exc}") from None
        q, proc = self._q, self._proc

        def pump() -> None:
            try:
                for raw in proc.stdout:
                    q.put(raw)
            except (OSError, ValueError):
                pass
            q.put(None)
        threading.Thread(target=pump, name="journalctl-reader", daemon=True).start()

    def read_batch(self, max_lines: int = 10000) -> Batch:
        b = Batch()
        if self._exited and self._q.empty():
            msg, self._exited, self._proc = self._exited, None, None
            raise SourceError(f"{self.describe()}: {msg}")
        if self._proc is None:
            self._spawn()
        for _ in range(max_lines):
            try:
                raw = self._q.get_nowait()
            except queue.Empty:
                break
            if raw is None:  # journalctl exited: report it, then restart after the last processed cursor
                rc = self._proc.poll() if self._proc is not None else None
                err = b""
                try:
                    err = self._proc.stderr.read() if self._proc is not None and self._proc.stderr else b""
                except (OSError, ValueError):
                    pass
                self._exited = f"exited with status {rc}: {err.decode('utf-8', 'replace').strip()[:300]}"
                break
            try:
                doc = json.loads(raw)
                msg = doc.get("MESSAGE", "")
                if isinstance(msg, list):  # journald's form for non-UTF-8 messages
                    msg = bytes(msg).decode("utf-8", "replace")
                cursor = doc["__CURSOR"]
            except (ValueError, KeyError, TypeError, AttributeError):
                b.bad += 1
                continue
            boot = doc.get("_BOOT_ID")
            if boot and self._boot and boot != self._boot:
                b.new_boot = True
            if boot:
                self._boot = boot
            self._cursor = cursor
            if isinstance(msg, str):
                b.lines.extend(msg.split("\n"))
            else:
                b.bad += 1
        return b

    @property
    def position(self) -> dict:
        return {"cursor": self._cursor, "boot_id": self._boot}

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._proc.terminate()
                self._proc.wait(timeout=5)
            except Exception:
                pass
            self._proc = None


# ---- simulated node ------------------------------------------------------------------------------
class SimSource:
    kind = "sim"

    def __init__(self, url: str, token: str, start_at: str = "beginning", timeout_s: float = 2.0):
        if start_at not in START_AT:
            raise ValueError(f"start_at must be one of {', '.join(START_AT)}, got {start_at!r}")
        self.url = url.rstrip("/")
        self.token = token
        self.start_at = start_at
        self.timeout_s = timeout_s
        self._session = requests.Session()
        self._boot: str | None = None
        self._line: int | None = None
        self._new_boot = False

    def describe(self) -> str:
        return f"sim {self.url}/admin/kernel-log"

    def start(self, position: dict | None) -> None:
        if position:
            self._boot = position.get("boot_id")
            self._line = int(position.get("line") or 0)

    def _get(self, start: int) -> requests.Response:
        try:
            r = self._session.get(f"{self.url}/admin/kernel-log", params={"from": start},
                                  headers={"Authorization": f"Bearer {self.token}"}, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise SourceError(f"{self.describe()}: {exc}") from None
        if r.status_code != 200:
            raise SourceError(f"{self.describe()}: HTTP {r.status_code}: {r.text[:200]}")
        return r

    def read_batch(self, max_lines: int = 10000) -> Batch:
        b = Batch()
        start = self._line or 0
        r = self._get(start)
        boot = r.headers.get("X-Boot-Id", "")
        total = int(r.headers.get("X-Kernel-Log-Lines", "0"))
        if self._boot is not None and boot != self._boot:
            b.new_boot = True  # the node restarted: its log starts again at line 0
            start = 0
            r = self._get(0)
            total = int(r.headers.get("X-Kernel-Log-Lines", "0"))
        elif self._line is None and self.start_at == "end":
            self._boot, self._line = boot, total
            return b
        self._boot = boot
        lines = r.text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        lines = lines[:max_lines]
        b.lines = lines
        self._line = start + len(lines)
        if self._line > total:  # cannot happen with a well-behaved server
            self._line = total
        return b

    @property
    def position(self) -> dict:
        return {"boot_id": self._boot, "line": self._line}

    def close(self) -> None:
        self._session.close()
