"""YAML text for generated rule and Alertmanager files: PyYAML's safe dumper plus comment lines.

Generated files stay readable for the people who load them into a real Prometheus: a mapping in a
list may carry a ``"#"`` key whose text is written as ``#`` comment lines above it, and multi-line
strings (long PromQL) are written in literal block style (``|-``).
"""

from __future__ import annotations

import yaml


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _plain(obj: object) -> object:
    """``obj`` without the comment keys (for the dumper)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items() if k != "#"}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def _has_comment(obj: object) -> bool:
    if isinstance(obj, dict):
        return "#" in obj or any(_has_comment(v) for v in obj.values())
    if isinstance(obj, list):
        return any(_has_comment(v) for v in obj)
    return False


def _emit(obj: object, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(obj, dict) and _has_comment(obj):
        lines: list[str] = []
        for key, value in obj.items():
            if key == "#":
                continue
            if isinstance(value, list) and _has_comment(value):
                lines.append(f"{pad}{key}:")
                for item in value:
                    lines.extend(_emit_item(item, indent))
            elif isinstance(value, dict) and _has_comment(value):
                lines.append(f"{pad}{key}:")
                lines.extend(_emit(value, indent + 2))
            else:
                lines.extend(_dump({key: value}, indent))
        return lines
    return _dump(obj, indent)


def _emit_item(item: object, indent: int) -> list[str]:
    pad = " " * indent
    lines = []
    if isinstance(item, dict) and "#" in item:
        for c in str(item["#"]).splitlines():
            lines.append(f"{pad}# {c}".rstrip())
    inner = _emit(item, indent + 2) if isinstance(item, dict) else _dump(item, indent + 2)
    first = inner[0][indent + 2:]
    lines.append(f"{pad}- {first}")
    lines.extend(inner[1:])
    return lines


def _dump(obj: object, indent: int) -> list[str]:
    text = yaml.dump(_plain(obj), Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
    return [(" " * indent + line) if line else line for line in text.rstrip("\n").splitlines()]


def dump(obj: object, header: str = "") -> str:
    """YAML text of ``obj`` (dicts, lists, scalars) with ``"#"`` keys as comments, after ``header``
    (comment lines, each starting with ``#``)."""
    body = "\n".join(_emit(obj, 0)) + "\n"
    return (header.rstrip("\n") + "\n" if header else "") + body
