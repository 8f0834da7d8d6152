"""One concern per file: no tracked Python module outside migrations is over 400 lines (split it along its seams)."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400  # past this a module holds more than one concern; migrations are generated and exempt


def _tracked_python_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z", "*.py"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    return sorted(p for p in listed.stdout.decode().split("\0") if p and "migrations" not in Path(p).parts)


def _line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def test_it_counts_lines_the_way_wc_does(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("a = 1\nb = 2\n")
    assert _line_count(sample) == 2


def test_no_module_outside_migrations_is_over_400_lines():
    files = _tracked_python_files()
    assert files, "git ls-files found no Python file: run the suite from a git checkout"
    offenders = {p: n for p in files if (ROOT / p).exists() and (n := _line_count(ROOT / p)) > MAX_LINES}
    listing = "\n".join(f"  {n:5d} {p}" for p, n in sorted(offenders.items(), key=lambda item: -item[1]))
    assert not offenders, f"modules over {MAX_LINES} lines (split each along its seams):\n{listing}"
