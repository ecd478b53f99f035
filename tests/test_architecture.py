"""The rules of the house that no linter checks: no module reaches into another's private
names, no module grows past what one reader holds in mind, and no test module imports another
(the layers themselves are import-linter's job, in ``make lint``)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "prompt_outbox"
MAX_LINES = 450
# Private by name, public by documentation: the standard library's own.
ALLOWED = {("os", "_exit")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_super_call(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_uses_another_modules_private_names() -> None:
    found = []
    for path in _modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                found += [
                    f"{path.name}:{node.lineno} imports {a.name}"
                    for a in node.names
                    if _private(a.name)
                ]
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                owner = node.value
                if isinstance(owner, ast.Name) and (
                    owner.id in ("self", "cls") or (owner.id, node.attr) in ALLOWED
                ):
                    continue
                if _is_super_call(owner):
                    continue  # an override calling the method it overrides: self's own
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert not found, "private names used from outside their owner:\n" + "\n".join(found)


def test_no_module_is_over_the_size_one_reader_holds() -> None:
    sizes = {p.relative_to(PACKAGE): len(p.read_text().splitlines()) for p in _modules()}
    assert len(sizes) > 30  # the walk found the package
    too_big = {str(p): n for p, n in sizes.items() if n > MAX_LINES}
    assert not too_big, too_big


TESTS = Path(__file__).resolve().parent


def _imported(tree: ast.Module) -> list[tuple[int, str]]:
    """Every dotted name one file imports, with the names it imports from a module appended
    (``from tests import conftest`` yields ``tests`` and ``tests.conftest``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ("." * node.level) + (node.module or "")
            names = [base] + [f"{base}.{a.name}".lstrip(".") for a in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names]
    return found


def _test_modules_imported(tree: ast.Module) -> list[tuple[int, str]]:
    """The ``tests.test_*`` modules one test file imports, however spelled."""
    return [(line, n) for line, n in _imported(tree) if n.split(".")[-1].startswith("test_")]


def test_no_test_module_imports_another() -> None:
    # What tests share lives in tests/support: a test module imported by another runs its
    # fixtures and import-time work twice and ties one file's edits to the other's tests.
    paths = sorted(TESTS.rglob("*.py"))
    assert len(paths) > 80  # the walk found the tests
    found = [
        f"{path.relative_to(TESTS)}:{line} imports {name}"
        for path in paths
        for line, name in _test_modules_imported(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert not found, "test modules importing test modules:\n" + "\n".join(found)


def test_nothing_imports_from_conftest() -> None:
    # conftest.py holds fixtures and hooks, as pytest advises; what tests share as code (FAST,
    # ManualClock, eventually) lives in tests/support, which conftest itself imports.
    found = [
        f"{path.relative_to(TESTS)}:{line} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, name in _imported(ast.parse(path.read_text(), filename=str(path)))
        if name.split(".")[-1] == "conftest"
    ]
    assert not found, "modules importing conftest:\n" + "\n".join(found)


def test_the_map_names_every_module() -> None:
    # docs/architecture.md is the newcomer's map of the rooms: a module it does not name is a
    # room nobody was told about.
    doc = (PACKAGE.parent.parent / "docs" / "architecture.md").read_text()
    unnamed = [
        str(path.relative_to(PACKAGE))
        for path in _modules()
        if path.name != "__init__.py" and f"`{path.name}`" not in doc
    ]
    assert unnamed == []
