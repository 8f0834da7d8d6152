"""kveval on LoCoMo end to end: recall@k per retriever, answers per mode scored per category, the written report."""
from __future__ import annotations

import json

import pytest

from kvengine.errors import ConfigError
from kvengine.kveval import cli
from kvengine.kveval.locomo import load_locomo, question_prompt
from kvengine.kveval.locomo_runner import LocomoConfig, run_locomo
from kvengine.kveval.metrics import locomo_resolve_choice, locomo_score
from kvengine.kveval.retrieval import DenseEncoder
from kvengine.kveval.runner import BackendPool


@pytest.fixture(scope="module")
def encoder():
    return DenseEncoder()


def _quiet(_: str) -> None:
    pass


def test_it_answers_every_asked_question_in_every_mode_and_scores_it_by_category(locomo_file, encoder):
    config = LocomoConfig(backend="fake", modes=("bm25", "hybrid", "cartridge"), top_k=2, max_new_tokens=8)
    data = load_locomo(locomo_file)
    results = run_locomo(config, data, encoder=encoder, progress=False, log=_quiet)
    questions = {q.qid: q for c in data.conversations for q in c.questions}
    assert results["config"]["modes"] == ["bm25", "hybrid", "cartridge"]
    for mode in ("bm25", "hybrid", "cartridge"):
        rows = [r for r in results["records"] if r["mode"] == mode]
        assert [r["qid"] for r in rows] == list(questions)  # every question, in file order
    for record in results["records"]:
        question = questions[record["qid"]]
        prompt, options = question_prompt(question, seed=0)
        assert record["prompt"] == prompt  # the paper's instructions by default
        scored = locomo_resolve_choice(record["prediction"], options) if options else record["prediction"]
        assert record["score"] == locomo_score(scored, question.answer, question.category)
        if record["mode"] != "cartridge":
            assert len(record["retrieved"]) == 2 and record["retrieved"] == sorted(record["retrieved"])
    summary = results["summary"]["bm25"]
    assert summary["num_by_category"] == {"1": 2, "2": 2, "3": 1, "4": 3, "5": 1}
    rows = [r for r in results["records"] if r["mode"] == "bm25"]
    four = [r["score"] for r in rows if r["category"] == 4]
    assert summary["f1_by_category"]["4"] == pytest.approx(100 * sum(four) / 3)
    scored = [r["score"] for r in rows if r["category"] != 5]
    assert summary["f1_1_4"] == pytest.approx(100 * sum(scored) / len(scored))
    assert summary["adversarial_accuracy"] == 100 * next(r["score"] for r in rows if r["category"] == 5)
    # the whole synthetic conversation fits one window
    assert results["data"]["conversations"][0]["cartridge"]["num_memories"] == 5


def test_it_measures_recall_on_every_question_with_evidence_without_a_model(locomo_file, encoder):
    config = LocomoConfig(backend="fake", modes=(), recall_ks=(1, 5))
    results = run_locomo(config, load_locomo(locomo_file), encoder=encoder, progress=False, log=_quiet)
    assert results["records"] == [] and results["summary"] == {} and results["backend"] == {}
    # conv-a has 5 questions with resolvable evidence, conv-b 2; every memory is within the top 5
    assert results["recall"]["num_questions"]["all"] == 7
    for name in ("bm25", "dense", "hybrid"):
        assert results["recall"][name]["5"]["all"] == 100.0
        assert results["recall"][name]["1"]["all"] < 100.0  # the two-turn questions cannot be met at k = 1
    ranks = {r["qid"]: r["ranks"]["bm25"] for r in results["recall_records"]}
    assert ranks["conv-b:0"] == [1]  # "What did Cy buy?" -> "I bought a red bicycle." (the only "Cy" turn)


def test_it_refuses_bad_options_naming_the_field():
    for options, field in [({"modes": ("text",)}, "modes"), ({"categories": (6,)}, "categories"),
                           ({"recall_ks": (0,)}, "recall_ks"), ({"retrievers": ("tfidf",)}, "retrievers"),
                           ({"questions_per_conversation": 0}, "questions_per_conversation")]:
        with pytest.raises(ConfigError, match=f"`{field}`"):
            LocomoConfig(**options)


def test_the_cli_writes_per_category_f1_and_recall(locomo_file, tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["--dataset", "locomo", "--locomo-file", str(locomo_file), "--backend", "fake",
                     "--modes", "bm25,hybrid", "--top-k", "2", "--max-new-tokens", "8", "--categories", "1,4,5",
                     "--conversations", "conv-a", "--questions-per-conversation", "2", "--recall-ks", "1,3",
                     "--out", str(out), "--no-progress"])
    assert code == 0
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["dataset"] == "locomo" and results["command"].startswith("python -m kvengine.kveval --dataset locomo")
    assert results["config"]["categories"] == [1, 4, 5] and results["config"]["questions_per_conversation"] == 2
    assert [c["sample_id"] for c in results["data"]["conversations"]] == ["conv-a"]
    assert len([r for r in results["records"] if r["mode"] == "hybrid"]) == 2
    assert {r["category"] for r in results["records"]} <= {1, 4, 5}
    assert set(results["recall"]["hybrid"]) == {"1", "3"}
    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert "## Evidence recall@k" in markdown and "| hybrid | 3 |" in markdown
    assert "| BM25 top-k text | 2 |" in markdown and "adversarial (5) acc." in markdown


def test_the_written_results_hold_none_of_the_datasets_text(locomo_file, tmp_path):
    out = tmp_path / "out"
    code = cli.main(["--dataset", "locomo", "--locomo-file", str(locomo_file), "--backend", "fake",
                     "--modes", "bm25", "--top-k", "2", "--max-new-tokens", "8", "--out", str(out), "--no-progress"])
    assert code == 0
    written = (out / "results.json").read_text(encoding="utf-8") + (out / "results.md").read_text(encoding="utf-8")
    # LoCoMo is CC BY-NC (evaluation only): no question, gold answer or turn of the file is in what a run writes
    for text in ("What is the name of Ann's puppy?", "hiking, painting", "I adopted a puppy named Rex", "puppy"):
        assert text not in written
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["records"] and all({"qid", "category", "mode", "score", "ttft_s"} <= set(r) for r in results["records"])


def test_the_cli_refuses_a_missing_file_and_a_squad_only_mode(tmp_path, locomo_file, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--dataset", "locomo", "--locomo-file", str(tmp_path / "none.json"), "--backend", "fake"])
    assert exit_info.value.code == 2 and "`--locomo-file`" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--dataset", "locomo", "--locomo-file", str(locomo_file), "--backend", "fake", "--modes", "text"])
    assert exit_info.value.code == 2 and "`modes`" in capsys.readouterr().err


def test_the_real_model_answers_locomo_questions_from_retrieved_turns(locomo_file, real_backend, encoder):
    config = LocomoConfig(modes=("closed_book", "bm25"), retrievers=("bm25",), top_k=2, max_new_tokens=12,
                          conversations=("conv-b",), categories=(4,))
    pool = BackendPool(config, factory=lambda *args, **kwargs: real_backend)  # type: ignore[arg-type]
    data = load_locomo(locomo_file, conversations=["conv-b"], categories=[4])
    results = run_locomo(config, data, pool=pool, encoder=encoder, progress=False, log=_quiet)
    by_mode = {r["mode"]: r for r in results["records"]}
    assert set(by_mode) == {"closed_book", "bm25"}
    # re-reading "I bought a red bicycle." the model names it; with no memory it cannot know
    assert "bicycle" in by_mode["bm25"]["prediction"].lower()
    assert by_mode["bm25"]["score"] > by_mode["closed_book"]["score"]
    assert by_mode["bm25"]["num_prompt_tokens"] > by_mode["closed_book"]["num_prompt_tokens"]
    assert results["summary"]["bm25"]["f1_by_category"]["4"] == 100 * by_mode["bm25"]["score"]
