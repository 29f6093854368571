"""The package's layers: each subpackage imports only the layers below it, and no import cycle.

This reads the source rather than importing it, so that every import counts: those under
``TYPE_CHECKING`` and those inside functions are dependencies all the same. ARCHITECTURE.md
explains the layers; pyproject.toml states the same rule as import-linter contracts, which CI
checks with ``lint-imports``.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "wasihost"

# Which layers each layer may import (its own always). Top-level modules (the package's
# __init__ and __main__, and the compatibility modules at old paths) are above every layer.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "store": frozenset({"core"}),
    "engine": frozenset({"core", "store"}),
    "wasi": frozenset({"core"}),
    "packaging": frozenset({"core", "store"}),
    "supervisor": frozenset({"core", "store"}),
    "brokers": frozenset({"core", "store", "supervisor", "wasi"}),
}
MAY_IMPORT["host"] = frozenset(MAY_IMPORT)
MAY_IMPORT["benchmark"] = MAY_IMPORT["host"] | {"host"}
MAY_IMPORT["cli"] = MAY_IMPORT["benchmark"] | {"benchmark"}


def _module_files(root: Path) -> dict[str, Path]:
    return {
        ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): path
        for path in root.rglob("*.py")
    }


def package_imports(root: Path = PKG) -> Iterator[tuple[str, str, int]]:
    """(importer, imported, line) for every import of one of the package's modules by another."""
    files = _module_files(root)
    for importer, path in files.items():
        package = path.relative_to(root.parent).parent.parts
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else ()
                module = ".".join((*base, node.module) if node.module else base)
                names = [f"{module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                # `from .x import Name` names a module's attribute: its module is the import.
                imported = name
                while imported.startswith(f"{root.name}.") and imported not in files:
                    imported = imported.rpartition(".")[0]
                if imported in files and imported != importer:
                    yield importer, imported, node.lineno


def layer_of(module: str) -> str:
    """The subpackage a module belongs to ("" for the package's own top-level modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in MAY_IMPORT) else ""


def upward_imports(root: Path = PKG) -> list[str]:
    wrong = []
    for importer, imported, line in package_imports(root):
        mine, theirs = layer_of(importer), layer_of(imported)
        if mine == theirs or mine == "":
            continue
        if theirs == "" or theirs not in MAY_IMPORT[mine]:
            wrong.append(f"{importer}:{line} imports {imported}")
    return wrong


def import_cycle(root: Path = PKG) -> tuple[str, ...] | None:
    graph: dict[str, set[str]] = {}
    for importer, imported, _ in package_imports(root):
        graph.setdefault(importer, set()).add(imported)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return tuple(exc.args[1])
    return None


def test_every_subpackage_is_a_known_layer() -> None:
    subpackages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert subpackages == set(MAY_IMPORT)


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = upward_imports()
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


def test_no_import_cycle() -> None:
    cycle = import_cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    "source",
    [
        "from ..host.runtime import Host\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..host import runtime\n",
        "def later():\n    from wasihost.host.runtime import Host\n",
        "from .. import errors\n",  # a compatibility module at the top
    ],
)
def test_the_check_sees_an_upward_import_however_it_is_written(tmp_path: Path, source: str) -> None:
    root = _write(
        tmp_path / "wasihost",
        {
            "__init__.py": "",
            "errors.py": "",
            "core/__init__.py": "",
            "core/codec.py": source,
            "host/__init__.py": "",
            "host/runtime.py": "Host = 1\n",
        },
    )
    assert upward_imports(root) == ["wasihost.core.codec:" + str(source.count("\n")) + " imports "
                                    + ("wasihost.errors" if "errors" in source else "wasihost.host.runtime")]


def test_the_check_sees_a_cycle_inside_a_layer(tmp_path: Path) -> None:
    root = _write(
        tmp_path / "wasihost",
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/a.py": "from . import b\n",
            "core/b.py": "def f():\n    from .a import x\n",
        },
    )
    assert upward_imports(root) == []
    assert set(import_cycle(root) or ()) == {"wasihost.core.a", "wasihost.core.b"}
