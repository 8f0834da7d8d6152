"""Tests share helpers through conftest.py fixtures and tests/support/ modules, never by importing another test
module (whose tests would then be collected twice, and whose private constants would become an interface)."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> list[str]:
    """The dotted names a file imports from (relative imports kept with their leading dots)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def _is_test_module(name: str) -> bool:
    return name.rsplit(".", 1)[-1].startswith("test_")


def test_it_finds_an_import_of_a_test_module(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text("from .test_other import FACTS\nimport tests.api.test_views\nfrom tests.support import x\n")
    assert [n for n in _imported_modules(sample) if _is_test_module(n)] == [".test_other", "tests.api.test_views"]


def test_no_test_file_imports_another_test_module():
    offenders = {
        str(path.relative_to(TESTS)): found
        for path in sorted(TESTS.rglob("*.py"))
        if (found := [n for n in _imported_modules(path) if _is_test_module(n)])
    }
    assert offenders == {}, "move what they share into a conftest.py fixture or a tests/support/ module"
