"""bin/check-imports finds no import circle and no private name taken across modules in the checkout, and fails on
a circle hidden in a function or on a private name imported from another module."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvengine", "memories", "cartridges", "core", "mnesio_site")


def _check_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(root / "bin" / "check-imports")], cwd=root, capture_output=True,
                          text=True, timeout=300)


def _copy_project(tmp_path: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (tmp_path / "bin").mkdir()
    shutil.copy(ROOT / "bin" / "check-imports", tmp_path / "bin" / "check-imports")
    return tmp_path


def _plant(copy: Path, module: str, body: str) -> None:
    target = copy / module
    assert target.exists(), f"{module} moved: point this test at another module"
    target.write_text(target.read_text() + f"\n\ndef _planted() -> None:\n    {body}\n")


def test_the_checkout_has_no_import_cycle_and_no_private_import():
    result = _check_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 import cycles, 0 private-name imports" in result.stdout


def test_it_fails_on_a_circle_hidden_in_a_function(tmp_path):
    copy = _copy_project(tmp_path)
    _plant(copy, "memories/services/locks.py", "from memories.services.forget import memory_forget_file  # noqa")
    result = _check_imports(copy)
    assert result.returncode == 1, result.stdout
    assert "import cycle among" in result.stdout and "memories.services.locks" in result.stdout
    assert "memories/services/locks.py" in result.stdout  # the planted line is named with its file


def test_it_fails_on_a_private_name_taken_from_another_module(tmp_path):
    copy = _copy_project(tmp_path)
    _plant(copy, "cartridges/services/destroy.py", "from cartridges.engine import _lock  # noqa")
    _plant(copy, "cartridges/metrics.py", "from cartridges import engine; engine._stats  # noqa")
    result = _check_imports(copy)
    assert result.returncode == 1, result.stdout
    assert "cartridges.services.destroy imports private cartridges.engine._lock" in result.stdout
    assert "cartridges.metrics uses private cartridges.engine._stats" in result.stdout
