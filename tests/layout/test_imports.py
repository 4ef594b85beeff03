"""The package's import graph points one way (issue 9): each folder may import only folders listed
before it in LAYERS; nothing imports gpuobs.cli; release safety and reports never reach the dev stack or
the simulator. Reads every module's imports with ast, so a violation fails here, not in review."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "gpuobs"

#: Lowest first. A module in layer i may import gpuobs.<layer j> only for j <= i.
LAYERS = ["core", "reference", "flags", "promapi", "exporter", "logwatch", "mixin", "compat", "canary", "rollout", "stack", "pager",
          "remediate", "drills", "doctor", "reports", "cli"]
#: Where a concept must not reach, whatever the layer order says (the adapters wire the rollout to a stack).
FORBIDDEN = {
    "compat": ("gpuobs.stack", "gpuobs.exporter"),
    "canary": ("gpuobs.stack", "gpuobs.exporter"),
    "rollout": ("gpuobs.stack", "gpuobs.exporter"),
    "reports": ("gpuobs.stack", "gpuobs.exporter"),
    "mixin": ("gpuobs.exporter",),
    "reference": ("gpuobs.exporter",),
    "flags": ("gpuobs.exporter", "gpuobs.stack"),
    "doctor": ("gpuobs.stack", "gpuobs.exporter"),
    "remediate": ("gpuobs.stack", "gpuobs.exporter"),
}
EXEMPT = {"rollout/adapters", "remediate/adapters"}  # adapters may import the dev stack and the exporter admin client


def imports_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
    return [m for m in out if m == "gpuobs" or m.startswith("gpuobs.")]


def modules():
    return sorted(p for p in PKG.rglob("*.py") if "_assets" not in p.parts)


def layer_of(path: Path) -> str | None:
    rel = path.relative_to(PKG).parts
    return rel[0] if len(rel) > 1 else None


def violations() -> list[str]:
    bad = []
    for path in modules():
        rel = path.relative_to(PKG).as_posix()
        layer = layer_of(path)
        exempt = any(rel.startswith(e + "/") for e in EXEMPT)
        for mod in imports_of(path):
            if rel == "__main__.py":  # `python -m gpuobs` is the CLI's entry point
                continue
            parts = mod.split(".")
            target = parts[1] if len(parts) > 1 else None
            if target == "cli" and layer != "cli":
                bad.append(f"{rel} imports {mod}: nothing imports the CLI")
            if layer is None or target not in LAYERS or exempt:
                continue
            if LAYERS.index(target) > LAYERS.index(layer):
                bad.append(f"{rel} ({layer}) imports {mod} ({target} is a higher layer)")
            if any(mod == f or mod.startswith(f + ".") for f in FORBIDDEN.get(layer, ())):
                bad.append(f"{rel} ({layer}) imports {mod}: {layer} must not depend on it")
        if layer == "core":
            bad += [f"{rel} (core) imports {m}" for m in imports_of(path) if not m.startswith("gpuobs.core")]
    return sorted(set(bad))


def test_every_top_level_folder_is_a_known_layer():
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= set(LAYERS), folders - set(LAYERS)


def test_imports_point_down_the_layers():
    assert violations() == []


def test_the_checker_catches_a_violation(tmp_path, monkeypatch):
    fake = tmp_path / "gpuobs"
    (fake / "canary").mkdir(parents=True)
    (fake / "canary" / "__init__.py").write_text("")
    (fake / "canary" / "bad.py").write_text("from gpuobs.stack.supervisor import load_state\nimport gpuobs.cli\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PKG"]), "PKG", fake)
    found = violations()
    assert any("higher layer" in v for v in found) and any("nothing imports the CLI" in v for v in found)


@pytest.mark.parametrize("folder", ["compat", "canary", "rollout", "reports"])
def test_no_argparse_or_printing_below_the_cli(folder):
    offenders = [p.relative_to(PKG).as_posix() for p in (PKG / folder).rglob("*.py")
                 if "argparse" in {m for m in _stdlib_imports(p)}]
    assert offenders == []


def _stdlib_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_simulator_state_never_formats_text():
    """exporter/sim holds state; collectors turn it into families; only exposition writes text."""
    bad = [f"{p.relative_to(PKG).as_posix()} imports {m}" for p in (PKG / "exporter" / "sim").rglob("*.py")
           for m in imports_of(p) if m.startswith(("gpuobs.exporter.exposition", "gpuobs.exporter.collectors",
                                                   "gpuobs.exporter.server"))]
    assert bad == []
