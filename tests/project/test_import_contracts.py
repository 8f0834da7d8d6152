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
    assert "9 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("kvengine/errors.py", "from django.conf import settings  # noqa", "kvengine is a pure engine"),
        ("memories/services/appends.py", "from cartridges import selectors  # noqa", "memories never imports cartridges"),
        ("cartridges/services/config.py", "from cartridges import tasks  # noqa", "they never send tasks"),
        ("cartridges/selectors.py", "import mnesio_site.celery  # noqa", "never reach into the project package"),
        ("core/pagination.py", "from memories.models import Scope  # noqa", "core is shared by both apps"),
        ("memories/services/locks.py", "from memories.services.erasure import erasure_request_file  # noqa",
         "memories' services in layers"),
        ("memories/selectors/subjects.py", "from memories.selectors.search import memory_search  # noqa",
         "memories' selectors in layers"),
        ("cartridges/services/compile.py", "from cartridges.services.answer import cartridge_answer  # noqa",
         "cartridges' services in layers"),
        ("cartridges/services/gate/checks.py", "from cartridges.services.gate.committable import GATES  # noqa",
         "the gate in layers"),
    ],
)
def test_it_fails_on_a_forbidden_import(tmp_path, module, line, contract):
    copy = _copy_project(tmp_path)
    target = copy / module
    assert target.exists(), f"{module} moved: point this test at another module of the package"
    target.write_text(target.read_text() + f"\n\ndef _forbidden() -> None:\n    {line}\n")
    result = _lint_imports(copy)
    assert result.returncode != 0, result.stdout
    # the contract is listed among the broken ones (a services -> tasks import breaks the services' layers too:
    # tasks import the services package)
    assert "Broken contracts" in result.stdout, result.stdout
    assert contract in result.stdout.split("Broken contracts", 1)[1], result.stdout
