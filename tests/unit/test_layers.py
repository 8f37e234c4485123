"""The package's imports only point down its layers, and no module dodges a cycle.

The layers, bottom to top: pure logic, Redis I/O, the actor, tools. A module
may import from its own layer only modules listed before it here, and any
module of a lower layer. ``actors/__init__.py`` re-exports from every layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "actors"

LAYERS = [
    ["_loop", "validation", "keys", "schedule", "messages", "lost", "stats", "jobs"],
    ["describe", "connection", "outcome", "evalsha", "readback", "scripts", "renewer"],
    ["_telemetry", "timer", "ref", "report", "lock_manager", "api", "aio", "leases"],
    ["_keeper", "embedded", "cli", "__main__", "bullmq"],
]
ORDER = {name: (layer, i) for layer, names in enumerate(LAYERS) for i, name in enumerate(names)}


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("actors"):
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(
                alias.name.split(".")[1] for alias in node.names if alias.name.startswith("actors.")
            )
    return found


def test_every_module_has_a_place_in_the_layers() -> None:
    modules = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(ORDER)


def test_imports_only_point_down() -> None:
    upward = []
    for name, place in ORDER.items():
        for target in _imported(PACKAGE / f"{name}.py"):
            if target in ORDER and ORDER[target] >= place:
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_no_import_hides_inside_a_function() -> None:
    hidden = []
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith(
                        "actors"
                    ):
                        hidden.append(f"{path.name}:{inner.lineno}")
    assert hidden == []
