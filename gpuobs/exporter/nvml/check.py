"""Device check: our NVML exporter's page against ``nvidia-smi --query-gpu`` on a real GPU machine.

``python -m gpuobs.exporter.nvml.check`` starts ``gpuobs exporter --source nvml`` on a free
loopback port, scrapes ``/metrics``, runs nvidia-smi, compares each GPU (UUID, bus id, name, driver
exactly; temperature within 3 C, power within 15 %, clocks within 10 %, memory used and free within 5 %
or 8 MiB), prints the table, writes it (and the page) under ``$OUT`` when set, stops the exporter and
exits 0 (all match), 1 (a mismatch, or the exporter failed) or 3 (inconclusive: no nvidia-smi).
``NVIDIA_SMI`` names another nvidia-smi binary (the tests use a fake one).
Standard library only, so it runs with any Python >= 3.11 that has nvidia-ml-py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpuobs.exporter.nvml.fields import FIELDS

SMI_QUERY = ("index,uuid,pci.bus_id,name,driver_version,temperature.gpu,power.draw,clocks.sm,clocks.mem,"
             "utilization.gpu,memory.used,memory.free,memory.total")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_labels(text: str) -> dict[str, str]:
    """``a="x",b="y"`` -> ordered dict, undoing the exposition escapes."""
    labels: dict[str, str] = {}
    i = 0
    while i < len(text):
        eq = text.index("=", i)
        key = text[i:eq].strip().lstrip(",").strip()
        j = eq + 2  # skip '="'
        out = []
        while text[j] != '"':
            if text[j] == "\\":
                j += 1
                out.append(_ESCAPES.get(text[j], "\\" + text[j]))
            else:
                out.append(text[j])
            j += 1
        labels[key] = "".join(out)
        i = j + 1
    return labels


def parse_page(text: str) -> list[tuple[str, dict[str, str], str]]:
    """Samples of an exposition page as ``(name, labels in page order, raw value text)``."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"unparsable sample line: {line!r}")
        out.append((m.group(1), _parse_labels(m.group(2) or ""), m.group(3)))
    return out


def parse_smi(csv_text: str) -> list[dict[str, str]]:
    """Rows of ``nvidia-smi --query-gpu=SMI_QUERY --format=csv,noheader,nounits``."""
    keys = SMI_QUERY.split(",")
    rows = []
    for line in csv_text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(keys):
            raise ValueError(f"nvidia-smi row has {len(cells)} cells, expected {len(keys)}: {line!r}")
        rows.append(dict(zip(keys, cells)))
    return rows


@dataclass
class Row:
    """One comparison: GPU, field, nvidia-smi's value, ours, the rule, and whether it held."""

    gpu: str
    field: str
    smi: str
    page: str
    rule: str
    ok: bool


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def compare(smi_csv: str, page_text: str) -> list[Row]:
    """Compare every nvidia-smi GPU with the page's series of the same UUID."""
    samples = parse_page(page_text)
    series: dict[str, dict[str, tuple[dict[str, str], str]]] = {}
    for name, labels, raw in samples:
        if "UUID" in labels and name.startswith("DCGM_FI_DEV_"):
            series.setdefault(labels["UUID"], {})[name] = (labels, raw)
    rows: list[Row] = []
    for smi in parse_smi(smi_csv):
        gpu, uuid = smi["index"], smi["uuid"]
        mine = series.get(uuid)
        if mine is None:
            rows.append(Row(gpu, "present", uuid, "(absent)", "on page", False))
            continue
        labels = next(iter(mine.values()))[0]
        host_key = "Hostname" if "Hostname" in labels else "hostname"
        for field, key in (("gpu", "index"), ("UUID", "uuid"), ("pci_bus_id", "pci.bus_id"),
                           ("modelName", "name"), ("DCGM_FI_DRIVER_VERSION", "driver_version")):
            got = labels.get(field, "(absent)")
            rows.append(Row(gpu, field, smi[key], got, "exact", got == smi[key]))
        rows.append(Row(gpu, host_key, socket.gethostname(), labels.get(host_key, "(absent)"), "info", True))

        def value(name: str) -> float | None:
            return _num(mine[name][1]) if name in mine else None

        def check(field: str, smi_key: str, ours: float | None, rule: str, tol) -> None:
            theirs = _num(smi[smi_key])
            shown = "(absent)" if ours is None else f"{ours:g}"
            if theirs is None and ours is None:
                rows.append(Row(gpu, field, smi[smi_key], shown, rule, True))
            elif theirs is None or ours is None:
                rows.append(Row(gpu, field, smi[smi_key], shown, rule, False))
            else:
                rows.append(Row(gpu, field, smi[smi_key], shown, rule, abs(ours - theirs) <= tol(theirs)))

        check("DCGM_FI_DEV_GPU_TEMP", "temperature.gpu", value("DCGM_FI_DEV_GPU_TEMP"), "±3 C", lambda t: 3.0)
        check("DCGM_FI_DEV_POWER_USAGE", "power.draw", value("DCGM_FI_DEV_POWER_USAGE"), "±15%",
              lambda t: 0.15 * abs(t))
        for field, key in (("DCGM_FI_DEV_SM_CLOCK", "clocks.sm"), ("DCGM_FI_DEV_MEM_CLOCK", "clocks.mem")):
            check(field, key, value(field), "±10%", lambda t: 0.10 * abs(t))
        for field, key in (("DCGM_FI_DEV_FB_USED", "memory.used"), ("DCGM_FI_DEV_FB_FREE", "memory.free")):
            check(field, key, value(field), "±5% or 8 MiB", lambda t: max(0.05 * abs(t), 8.0))
        used, free = value("DCGM_FI_DEV_FB_USED"), value("DCGM_FI_DEV_FB_FREE")
        total = None if used is None or free is None else used + free + (value("DCGM_FI_DEV_FB_RESERVED") or 0)
        check("FB_USED+FREE+RESERVED", "memory.total", total, "±1%", lambda t: 0.01 * abs(t))
        util = value("DCGM_FI_DEV_GPU_UTIL")
        rows.append(Row(gpu, "DCGM_FI_DEV_GPU_UTIL", smi["utilization.gpu"],
                        "(absent)" if util is None else f"{util:g}", "info", True))
    listed = {row["uuid"] for row in parse_smi(smi_csv)}
    for uuid in sorted(set(series) - listed):
        rows.append(Row("?", "present", "(absent)", uuid, "listed by nvidia-smi", False))
    success = [raw for name, _, raw in samples if name == "gpuobs_exporter_collector_success"]
    rows.append(Row("-", "gpuobs_exporter_collector_success", "1", ",".join(success) or "(absent)", "exact",
                    success == ["1"]))
    return rows


def table(rows: list[Row]) -> str:
    """Fixed-width text table of the comparison rows."""
    head = ("gpu", "field", "nvidia-smi", "exporter", "rule", "result")
    cells = [head] + [(r.gpu, r.field, r.smi, r.page, r.rule, "ok" if r.ok else "MISMATCH") for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(head))).rstrip() for c in cells) + "\n"


def coverage(page_text: str) -> str:
    """Which DCGM fields each GPU's page has and lacks, plus the collector's self-metrics."""
    present: dict[str, set[str]] = {}
    lines = []
    for name, labels, raw in parse_page(page_text):
        if "gpu" in labels and name.startswith("DCGM_"):
            present.setdefault(labels["gpu"], set()).add(name)
        elif name.startswith("gpuobs_"):
            lines.append(f"  {name}{labels} {raw}")
    out = []
    for gpu, names in sorted(present.items()):
        missing = [n for n in [f[0] for f in FIELDS] + ["DCGM_FI_DEV_XID_ERRORS"] if n not in names]
        out.append(f"gpu {gpu}: {len(names)} DCGM series; absent (not supported here): {', '.join(missing) or '-'}")
    return "\n".join(out + ["self-metrics:"] + lines) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=20) as r:
        return r.read().decode()


def main() -> int:
    """Run the whole device check; see the module docstring for exit codes."""
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    report: list[str] = []

    def emit(text: str) -> None:
        print(text, end="" if text.endswith("\n") else "\n", flush=True)
        report.append(text if text.endswith("\n") else text + "\n")

    def finish(code: int) -> int:
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "nvml-check.txt").write_text("".join(report))
        return code

    smi = shutil.which(os.environ.get("NVIDIA_SMI") or "nvidia-smi")
    if smi is None:
        emit("INCONCLUSIVE: nvidia-smi not found; is this a GPU machine?")
        return finish(3)
    repo = Path(__file__).resolve().parents[3]
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", "gpuobs", "exporter", "--source", "nvml", "--host", "127.0.0.1",
                             "--base-port", str(port)], cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        page, deadline = None, time.monotonic() + 30
        while page is None:
            if proc.poll() is not None:
                log.seek(0)
                emit(f"FAIL: exporter exited with {proc.returncode}:\n{log.read()[-3000:]}")
                return finish(1)
            try:
                _get(f"http://127.0.0.1:{port}/health")
                page = _get(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                if time.monotonic() > deadline:
                    emit("FAIL: exporter did not answer within 30 s")
                    return finish(1)
                time.sleep(0.2)
        res = subprocess.run([smi, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            emit(f"INCONCLUSIVE: nvidia-smi exited {res.returncode}: {res.stderr.strip()}")
            return finish(3)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "nvml-page.txt").write_text(page)
        emit(f"nvidia-smi --query-gpu={SMI_QUERY}\n{res.stdout}")
        rows = compare(res.stdout, page)
        emit(table(rows))
        emit(coverage(page))
        try:
            from prometheus_client.parser import text_string_to_metric_families
            n = sum(1 for _ in text_string_to_metric_families(page))
            emit(f"prometheus_client parser: {n} families parsed")
        except ImportError:
            emit("prometheus_client not installed: parser check skipped")
        except Exception as exc:  # the page must parse
            rows.append(Row("-", "page parses", "yes", f"no: {exc}", "prometheus_client", False))
        bad = [r for r in rows if not r.ok]
        emit(f"RESULT: {'PASS' if not bad and rows else 'FAIL'} ({len(rows) - len(bad)}/{len(rows)} checks ok)")
        return finish(0 if not bad and rows else 1)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a timeout still stops the exporter (finally)
    sys.exit(main())
