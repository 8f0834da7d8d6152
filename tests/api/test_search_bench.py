"""The search benchmark (bench/search_latency.py) at test size: it runs, and every query it times answers 200
with matches. Speed is measured by the benchmark itself (BENCHMARKS.md), never asserted here."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.django_db

BENCH = Path(__file__).resolve().parents[2] / "bench" / "search_latency.py"


def test_the_search_benchmark_runs_at_a_small_size():
    spec = importlib.util.spec_from_file_location("bench_search_latency", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    figures = module.run(num_memories=20, num_queries=6, top_k=5)
    assert figures["api"]["num"] == figures["selector"]["num"] == 6
    assert figures["mean_hits"] > 0 and figures["met"] is None  # the target is judged at 200 memories only
