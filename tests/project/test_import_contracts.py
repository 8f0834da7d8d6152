"""The layering of STYLE.md is enforced by import-linter (pyproject.toml), and a forbidden import fails it."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("kvengine", "memories", "cartridges", "core", "mnesio_site")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (requirements.txt)")


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def _copy_project(tmp_path: Path) -> Path:
    """A copy of the packages and the contracts, to break without touching the checkout."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_checkout_keeps_every_contract():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("kvengine/errors.py", "from django.conf import settings  # noqa", "kvengine is a pure engine"),
        ("memories/services/appends.py", "from cartridges import selectors  # noqa", "memories never imports cartridges"),
        ("cartridges/services/config.py", "from cartridges import tasks  # noqa", "they never send tasks"),
        ("cartridges/selectors.py", "import mnesio_site.celery  # noqa", "never reach into the project package"),
        ("core/pagination.py", "from memories.models import Scope  # noqa", "core is shared by both apps"),
    ],
)
def test_it_fails_on_a_forbidden_import(tmp_path, module, line, contract):
    copy = _copy_project(tmp_path)
    target = copy / module
    assert target.exists(), f"{module} moved: point this test at another module of the package"
    target.write_text(target.read_text() + f"\n\ndef _forbidden() -> None:\n    {line}\n")
    result = _lint_imports(copy)
    assert result.returncode != 0, result.stdout
    assert "1 broken" in result.stdout and contract in result.stdout, result.stdout
