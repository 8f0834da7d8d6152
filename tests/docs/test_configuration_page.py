"""docs/configuration.md is what `python -m core.settings_doc` prints from the declaration now, and lists every
declared variable with its type, default and bounds."""
from __future__ import annotations

import subprocess
import sys

from core.settings_doc import COMMAND, PAGE, render
from core.settings_spec import DECLARED


def test_the_committed_page_is_the_generated_one():
    assert PAGE.read_text(encoding="utf-8") == render(), f"docs/configuration.md is stale: run `{COMMAND}`"


def test_the_command_prints_the_page_without_django_settings():
    out = subprocess.run([sys.executable, "-m", "core.settings_doc"], cwd=PAGE.parents[1], capture_output=True,
                         text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    assert out == render()


def test_every_variable_has_a_row_with_its_bounds():
    rows = {line.split("|")[1].strip(" `"): line for line in render().splitlines() if line.startswith("| `")}
    assert set(rows) == {s.name for s in DECLARED}
    assert "| integer | `64` | >= 64 and <= 8192, a multiple of 64 |" in rows["MNESIO_KV_BLOCK_SIZE"]
    assert "| number | `0.95` | between 0.0 and 1.0 |" in rows["MNESIO_GATE_MIN_FIDELITY"]
    assert "| choice | `f32` | `f32`, `bf16`, `f16`, `bf16r`, `f32w8`, `bf16w8` |" in rows["MNESIO_KV_DTYPE"]
