"""The CI smoke version of kveval: the real default model on the committed SQuAD subset, tiny budget."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvengine.kveval.data import load_squad
from kvengine.kveval.report import write_report
from kvengine.kveval.runner import MODES, BackendPool, EvalConfig, run_eval

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "squad_subset" / "squad_v1.1_dev_subset.json"

pytestmark = pytest.mark.model


def _shared(real_backend):
    """A backend factory that hands out the session's real model instead of loading a second copy."""
    def factory(name, **options):
        assert (name, options["dtype"], options["quant"]) == ("transformers", "f32", "none"), options
        return real_backend
    return factory


def test_smoke_cartridge_answers_equal_text_rereading_on_real_squad(real_backend, artifacts_dir):
    config = EvalConfig(budgets=(256,), questions=(2,), articles=(1,), top_k=1, max_new_tokens=10,
                        quants=(), compare_dtypes=())
    start = time.perf_counter()
    run = run_eval(config, load_squad(FIXTURE), pool=BackendPool(config, factory=_shared(real_backend)),
                   progress=False, log=lambda _: None)
    elapsed = time.perf_counter() - start
    results = run.as_dict()
    (budget,) = results["budgets"]

    # parity by construction: the f32 cartridge gives the very tokens that re-reading the text gives
    assert budget["parity"]["num_questions"] == 2
    assert budget["parity"]["mismatched_qids"] == []
    assert results["checks"]["parity_all_identical"] is True
    text_records = {r["qid"]: r for r in budget["records"] if r["mode"] == "text"}
    for record in (r for r in budget["records"] if r["mode"] == "cartridge"):
        assert record["prediction"] == text_records[record["qid"]]["prediction"]
        assert record["token_ids"]  # a real answer was generated
        # the cartridge runs only the question through the model; re-reading runs the memories again
        assert record["num_prompt_tokens"] < text_records[record["qid"]]["num_prompt_tokens"]
        assert record["num_context_tokens"] == text_records[record["qid"]]["num_context_tokens"] > 100

    # metrics sane: percentages, EM never above F1, timings positive and ordered
    assert tuple(results["config"]["modes"]) == MODES  # closed_book (the no-memory floor) included
    for mode in MODES:
        s = budget["summary"][mode]
        assert s["num_questions"] == 2
        assert 0.0 <= s["em"] <= s["f1"] <= 100.0
        assert 0 < s["ttft_s"]["median"] <= s["total_s"]["median"]
    assert budget["scopes"][0]["num_tokens"] <= 256
    results["smoke_elapsed_s"] = round(elapsed, 1)  # CI's budget is 3 minutes; kept with the artifacts
    paths = write_report(results, artifacts_dir / "kveval-smoke")
    assert paths["accuracy_png"].stat().st_size > 0
