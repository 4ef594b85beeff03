"""Sourced facts and their loaders, one ``data/`` folder: the Xid catalogue (:mod:`.xid`),
CUDA/driver/GPU/engine tables (:mod:`.compat`), dcgm-exporter's counters files, Xid texts and
clock-event bits (:mod:`.dcgm_exporter`), vLLM's buckets (:mod:`.buckets`), the release catalogue
(:mod:`.releases`) and the driver catalogue (:mod:`.drivers`). :func:`read_yaml` reads a catalogue,
packaged or a user's file."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: Path | str | None, packaged: str) -> Any:
    """The YAML document at ``path``, or the packaged ``gpuobs/reference/data/<packaged>`` when ``path``
    is None. Raises ValueError with one line (the parser's first line) when it cannot be read or parsed;
    callers wrap it in their own input error naming the file."""
    try:
        if path is None:
            text = resources.files("gpuobs.reference").joinpath(f"data/{packaged}").read_text(encoding="utf-8")
        else:
            text = Path(path).read_text(encoding="utf-8")
        return yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read it as YAML ({str(exc).splitlines()[0]})") from None
