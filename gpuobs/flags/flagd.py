"""The fleet's feature-flag file in flagd's flag-definition format: create, read, target nodes, kill.

Format: flagd flag definitions (https://flagd.dev/reference/flag-definitions/, JSON schema
https://flagd.dev/schema/v0/flags.json), the common file format of OpenFeature's flagd providers;
every engine evaluates the file in-process through the OpenFeature SDK
(:mod:`gpuobs.flags.evaluate`), no flag server. Each gpuobs flag is boolean and targeted by node
identity: the evaluation context's ``targetingKey`` is the node's hostname::

    {"$schema": "https://flagd.dev/schema/v0/flags.json",
     "flags": {"spec_decode": {
        "state": "ENABLED", "variants": {"on": true, "off": false}, "defaultVariant": "off",
        "targeting": {"if": [{"in": [{"var": "targetingKey"}, ["gpu-node-00"]]}, "on", "off"]},
        "metadata": {"killed": false, "reason": "...", "updatedAt": 1764612000.0}}}}

``targeting`` is json-logic (flagd's targeting rules): the ``in`` operator over the list of hostnames
the flag is on for. The default variant is always ``off``, so a node missing from the list (a new
node, a typo) runs with the flag off. **Kill switch** (:meth:`FlagFile.kill`): one atomic write that
empties the list and sets ``metadata.killed``; while killed, :meth:`FlagFile.set_hosts` refuses to
turn the flag on anywhere until a new rollout clears it (``clear_kill``).

Writers (the flag rollout controller, ``gpuobs flag kill``) serialise through an ``flock`` on
``<file>.lock`` and write with :func:`gpuobs.core.files.atomic_write`, so an engine never reads half a
file and a kill from one process is never lost under a rollout's write from another. Which hosts a
flag is on for is answered by flagd's own evaluator (``FlagdCore``, the engine-side code), never by
a json-logic reimplementation.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from openfeature.contrib.tools.flagd.core import FlagdCore
from openfeature.evaluation_context import EvaluationContext

from gpuobs.core.errors import InputError
from gpuobs.core.files import atomic_write
from gpuobs.reference.releases import FLAG_KEY

SCHEMA_URL = "https://flagd.dev/schema/v0/flags.json"
ON, OFF = "on", "off"
#: Default file name under a stack's run directory.
FILE_NAME = "flags.json"


class FlagFileError(InputError):
    """The flag file is missing, unreadable, not flagd JSON, or not in gpuobs's managed shape; the
    message names the flag and field."""


def definition(hosts: Iterable[str], *, killed: bool = False, reason: str = "", now: float | None = None) -> dict:
    """One flag's flagd definition: on for ``hosts`` (sorted), off elsewhere."""
    return {"state": "ENABLED", "variants": {ON: True, OFF: False}, "defaultVariant": OFF,
            "targeting": {"if": [{"in": [{"var": "targetingKey"}, sorted(set(hosts))]}, ON, OFF]},
            "metadata": {"killed": bool(killed), "reason": str(reason),
                         "updatedAt": float(time.time() if now is None else now)}}


def document(flags: Iterable[str], now: float | None = None) -> dict:
    """A flag file with every flag in ``flags`` off everywhere."""
    return {"$schema": SCHEMA_URL, "flags": {f: definition([], reason="created", now=now) for f in flags}}


def managed_hosts(flag: str, spec: Any) -> list[str]:
    """The host list of a gpuobs-managed definition; FlagFileError naming the field if it is not one."""
    where = f"flag {flag}"
    if not isinstance(spec, dict):
        raise FlagFileError(f"{where}: definition must be an object")
    if spec.get("variants") != {ON: True, OFF: False}:
        raise FlagFileError(f"{where}: field 'variants' must be {{\"on\": true, \"off\": false}}")
    if spec.get("defaultVariant") != OFF:
        raise FlagFileError(f"{where}: field 'defaultVariant' must be \"off\" (gpuobs targets nodes explicitly)")
    try:
        cond, on, off = spec["targeting"]["if"]
        key, hosts = cond["in"]
        ok = key == {"var": "targetingKey"} and (on, off) == (ON, OFF) and isinstance(hosts, list)
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok or not all(isinstance(h, str) for h in hosts):
        raise FlagFileError(f"{where}: field 'targeting' must be "
                            '{"if": [{"in": [{"var": "targetingKey"}, [HOSTNAMES]]}, "on", "off"]}')
    return list(hosts)


class FlagFile:
    """The flag file at ``path`` (flagd JSON). Methods that write take the file's lock."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the writers' ``flock`` (blocking)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def ensure(self, flags: Iterable[str]) -> None:
        """Create the file with every flag off if it is missing; add any flag it lacks (off). Keeps
        the state of flags already in it, so a stack restart does not re-enable or kill anything."""
        flags = list(flags)
        with self.locked():
            if not self.path.exists():
                self._write(document(flags))
                return
            doc = self.read()
            missing = [f for f in flags if f not in doc["flags"]]
            if missing:
                doc["flags"].update({f: definition([], reason="created") for f in missing})
                self._write(doc)

    def read(self) -> dict:
        """The parsed document; FlagFileError when missing, not JSON, or not a flagd document."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FlagFileError(f"flag file {self.path} does not exist (`gpuobs stack up` writes it)") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise FlagFileError(f"flag file {self.path}: cannot read it as JSON ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("flags"), dict):
            raise FlagFileError(f"flag file {self.path}: field 'flags' must be an object of flag definitions")
        for key in doc["flags"]:
            if not FLAG_KEY.match(str(key)):
                raise FlagFileError(f"flag file {self.path}: flag key {key!r} must match {FLAG_KEY.pattern}")
        return doc

    def spec(self, flag: str) -> dict:
        """The definition of ``flag``; FlagFileError listing the flags in the file otherwise."""
        flags = self.read()["flags"]
        if flag not in flags:
            raise FlagFileError(f"flag {flag!r} is not in {self.path}; flags there: {', '.join(flags) or 'none'}")
        return flags[flag]

    def enabled(self, flag: str, host: str) -> bool:
        """What ``host`` evaluates ``flag`` to under the file as it is now (flagd's evaluator)."""
        core = FlagdCore()
        core.set_flags(self.read())
        res = core.resolve_boolean_value(flag, False, EvaluationContext(targeting_key=host))
        if res.error_code is not None:
            raise FlagFileError(f"flag {flag}: flagd cannot evaluate it: {res.error_message or res.error_code}")
        return bool(res.value)

    def hosts(self, flag: str) -> list[str]:
        """Hosts the file turns ``flag`` on for."""
        return managed_hosts(flag, self.spec(flag))

    def killed(self, flag: str) -> bool:
        """Whether the kill switch was pulled on ``flag`` (and not cleared by a new rollout since)."""
        return bool((self.spec(flag).get("metadata") or {}).get("killed"))

    def set_hosts(self, flag: str, on: Iterable[str] = (), off: Iterable[str] = (), reason: str = "") -> list[str]:
        """Turn ``flag`` on for ``on`` and off for ``off`` (one atomic write); returns the hosts it was on
        for before. FlagFileError if the flag is killed and ``on`` is not empty."""
        on, off = set(on), set(off)
        with self.locked():
            doc = self.read()
            spec = doc["flags"].get(flag)
            if spec is None:
                raise FlagFileError(f"flag {flag!r} is not in {self.path}; flags there: {', '.join(doc['flags'])}")
            before = managed_hosts(flag, spec)
            meta = spec.get("metadata") or {}
            if on and meta.get("killed"):
                raise FlagFileError(f"flag {flag} is killed ({meta.get('reason') or 'no reason'}); "
                                    "start a new `gpuobs flag rollout` to enable it again")
            doc["flags"][flag] = definition((set(before) | on) - off, killed=bool(meta.get("killed")),
                                            reason=reason or meta.get("reason", ""))
            self._write(doc)
            return before

    def kill(self, flag: str, reason: str) -> list[str]:
        """The kill switch: ``flag`` off on every node in one atomic write, and marked killed. Returns
        the hosts it was on for."""
        with self.locked():
            doc = self.read()
            if flag not in doc["flags"]:
                raise FlagFileError(f"flag {flag!r} is not in {self.path}; flags there: {', '.join(doc['flags'])}")
            before = managed_hosts(flag, doc["flags"][flag])
            doc["flags"][flag] = definition([], killed=True, reason=reason or "killed")
            self._write(doc)
            return before

    def clear_kill(self, flag: str, reason: str) -> None:
        """Allow ``flag`` to be turned on again (a new rollout starts); its hosts stay as they are."""
        with self.locked():
            doc = self.read()
            before = managed_hosts(flag, doc["flags"][flag])
            doc["flags"][flag] = definition(before, killed=False, reason=reason)
            self._write(doc)

    def _write(self, doc: dict) -> None:
        atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=False) + "\n")
