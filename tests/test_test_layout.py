"""How the tests are laid out: helpers live in `tests/support/`, conftest files hold fixtures, and no
test module imports another test module or a conftest (pytest runs those; importing one runs its
tests' module code twice and hides where a helper lives). Read statically with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)


def is_test_module(path: Path) -> bool:
    return path.name.startswith("test_") or path.name == "conftest.py"


def imported_modules(tree: ast.Module) -> set[str]:
    """Every module an import statement names, `from a import b` counting a and a.b."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_no_test_module_imports_another_test_module_or_a_conftest():
    test_modules = {module_name(path) for path in TESTS.rglob("*.py") if is_test_module(path)}

    found = [
        f"{path.relative_to(TESTS.parent)} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in sorted(imported_modules(ast.parse(path.read_text())) & test_modules)
    ]

    assert found == [], "move what is shared to tests/support/"


def _is_fixture_or_hook(node: ast.stmt) -> bool:
    if not isinstance(node, ast.FunctionDef):
        return False
    if node.name.startswith("pytest_"):
        return True
    return any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)


def test_conftest_files_hold_fixtures_only():
    found = []
    for path in sorted(TESTS.rglob("conftest.py")):
        tree = ast.parse(path.read_text())
        for index, node in enumerate(tree.body):
            is_docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            if is_docstring or isinstance(node, ast.Import | ast.ImportFrom) or _is_fixture_or_hook(node):
                continue
            found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno} {ast.unparse(node).splitlines()[0]}")

    assert found == [], "helpers and constants belong in tests/support/"


def test_the_layout_checks_catch_a_test_module_import_and_a_helper_in_a_conftest():
    tree = ast.parse("from tests.api.test_jobs import JOB\nfrom tests.support.calls import auth\n")
    conftest = ast.parse(
        "import pytest\nLIMIT = 3\n@pytest.fixture\ndef store():\n    return 1\ndef helper():\n    pass\n"
    )

    assert "tests.api.test_jobs" in imported_modules(tree) and "tests.support.calls" in imported_modules(tree)
    assert [_is_fixture_or_hook(node) for node in conftest.body[1:]] == [False, True, False]
