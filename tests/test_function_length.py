"""No function in the package is over 120 lines (issue 29): a long one is split into named
steps with its cold branches in functions of their own, and a table-building one into data.

A function is counted from its ``def`` to its last line, the functions nested in it included
(what a reader has to hold at once), so a nested function is counted on its own too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "wasihost"
MAX_LINES = 120

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _functions(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
    """(qualified name, line of the ``def``, lines) of every function under ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _FUNCTIONS):
            name = f"{prefix}{child.name}"
            assert child.end_lineno is not None
            yield name, child.lineno, child.end_lineno - child.lineno + 1
            yield from _functions(child, f"{name}.<locals>.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def long_functions() -> list[str]:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, line, lines in _functions(tree, ""):
            if lines > MAX_LINES:
                found.append(f"{path.relative_to(PKG.parent)}:{line} {name}: {lines} lines")
    return found


def test_the_count_takes_nested_functions_and_methods() -> None:
    tree = ast.parse(
        "class A:\n    def f(self):\n        def g():\n            pass\n\n        return g\n"
    )
    assert list(_functions(tree, "")) == [("A.f", 2, 5), ("A.f.<locals>.g", 3, 2)]


def test_no_function_is_over_120_lines() -> None:
    found = long_functions()
    assert not found, f"{len(found)} functions over {MAX_LINES} lines:\n" + "\n".join(found)
