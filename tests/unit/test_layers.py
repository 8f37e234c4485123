"""The package's imports only point down its layers, and no module dodges a cycle.

The layers, bottom to top: pure logic, records and Redis I/O, the actor, tools. A module
may import from its own layer only modules listed before it here, and any
module of a lower layer. ``actors/__init__.py`` re-exports from every layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "actors"

LAYERS = [
    ["timing", "keys", "messages", "jobs", "books"],
    ["telemetry", "connection", "scripts", "fencing"],
    [
        "timer",
        "report",
        "ref",
        "lock_manager",
        "process",
        "api",
        "aio",
        "leases",
    ],
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


def _files(name: str) -> list[Path]:
    """The files of one module of the package: itself, or every file of a subpackage."""
    folder = PACKAGE / name
    return sorted(folder.glob("*.py")) if folder.is_dir() else [PACKAGE / f"{name}.py"]


def test_every_module_has_a_place_in_the_layers() -> None:
    modules = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert modules | packages == set(ORDER)


def test_imports_only_point_down() -> None:
    upward = []
    for name, place in ORDER.items():
        for path in _files(name):
            for target in _imported(path) - {name}:
                if target in ORDER and ORDER[target] >= place:
                    upward.append(f"{name} -> {target}")
    assert upward == []


def test_no_subpackage_imports_the_package_root() -> None:
    # The root re-exports every layer: a module below it that imported it
    # would import itself, and hide which layer it really uses.
    rooted = []
    for path in PACKAGE.glob("*/*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ImportFrom) and node.module == "actors") or (
                isinstance(node, ast.Import) and any(a.name == "actors" for a in node.names)
            ):
                rooted.append(f"{path.parent.name}/{path.name}:{node.lineno}")
    assert rooted == []


def test_no_import_hides_inside_a_function() -> None:
    hidden = []
    for path in [*PACKAGE.glob("*.py"), *PACKAGE.glob("*/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith(
                        "actors"
                    ):
                        hidden.append(f"{path.name}:{inner.lineno}")
    assert hidden == []
