"""The search recall benchmark (bench/search_recall.py) on a tiny LoCoMo-shaped file: it runs, ranks every
evidence turn by each retriever, and writes no text of the data set. Recall is measured by the benchmark itself
(BENCHMARKS.md), never asserted here."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.support.encoders import ConceptEncoder

pytestmark = pytest.mark.django_db

BENCH = Path(__file__).resolve().parents[2] / "bench" / "search_recall.py"
SECRET = "okapi-lantern"  # a word of the data set that must not reach the results


def _locomo(path: Path) -> Path:
    turns = [{"speaker": "Ann", "dia_id": "D1:1", "text": f"My cat Luna likes the {SECRET}."},
             {"speaker": "Bo", "dia_id": "D1:2", "text": "I parked the car in the garage."},
             {"speaker": "Ann", "dia_id": "D1:3", "text": "We adopted a puppy."}]
    sample = {"sample_id": "conv-x", "conversation": {"speaker_a": "Ann", "speaker_b": "Bo", "session_1": turns,
                                                      "session_1_date_time": "1 May, 2023"},
              "qa": [{"question": "Which feline is hers?", "answer": "Luna", "evidence": ["D1:1"], "category": 4},
                     {"question": "Where was the car parked?", "answer": "garage", "evidence": ["D1:2"], "category": 4}]}
    path.write_text(json.dumps([sample]))
    return path


def test_the_recall_benchmark_runs_on_a_tiny_conversation(settings, monkeypatch, tmp_path):
    from memories import search_dense

    settings.MNESIO_WEB_LOADS_MODEL = True
    monkeypatch.setattr(search_dense, "_encoder", ConceptEncoder())
    monkeypatch.setattr(search_dense, "_held", {})
    spec = importlib.util.spec_from_file_location("bench_search_recall", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    figures = module.run(data=_locomo(tmp_path / "locomo.json"), conversations=["conv-x"])
    assert figures["recall"]["num_questions"]["all"] == 2
    assert set(figures["records"][0]["ranks"]) == {"product_bm25", "product_hybrid", "kveval_bm25", "kveval_hybrid"}
    assert figures["records"][0]["ranks"]["product_hybrid"] == [1]  # "feline": found by meaning
    assert figures["records"][0]["ranks"]["product_bm25"] == [11]  # past every k: BM25 shares no word with it
    dumped = json.dumps(figures)
    assert SECRET not in dumped and "feline" not in dumped and "garage" not in dumped
