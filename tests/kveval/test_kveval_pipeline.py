"""The whole eval pipeline on the fake backend: modes, figures, parity, variants, and the written report."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvengine.errors import ConfigError
from kvengine.kveval.data import load_squad
from kvengine.kveval.metrics import squad_scores
from kvengine.kveval.report import write_report
from kvengine.kveval.runner import MODES, EvalConfig, run_eval, token_agreement

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "squad_subset" / "squad_v1.1_dev_subset.json"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake_results():
    config = EvalConfig(backend="fake", budgets=(300, 600), questions=(4, 6), articles=(2,), top_k=2)
    run = run_eval(config, load_squad(FIXTURE), progress=False, log=lambda _: None)
    return run.as_dict()


def test_it_answers_every_picked_question_in_every_mode(fake_results):
    for budget in fake_results["budgets"]:
        assert list(fake_results["config"]["modes"]) == [m for m in MODES if m != "closed_book"]  # the fake has no floor
        qids = {mode: [r["qid"] for r in budget["records"] if r["mode"] == mode] for mode in MODES[:4]}
        assert len(set(map(tuple, qids.values()))) == 1  # same questions, same order, in every mode
        expected = {300: 4, 600: 6}[budget["budget"]]
        assert len(qids["cartridge"]) == expected == budget["summary"]["cartridge"]["num_questions"]


def test_it_scores_each_answer_with_the_official_metrics(fake_results):
    for budget in fake_results["budgets"]:
        for record in budget["records"]:
            assert (record["em"], record["f1"]) == squad_scores(record["prediction"], record["answers"])
        cart = [r for r in budget["records"] if r["mode"] == "cartridge"]
        assert budget["summary"]["cartridge"]["f1"] == pytest.approx(100 * sum(r["f1"] for r in cart) / len(cart))


def test_retrieval_modes_read_only_the_top_k_paragraphs(fake_results):
    for budget in fake_results["budgets"]:
        scopes = {s["article"]: s for s in budget["scopes"]}
        for record in budget["records"]:
            if record["mode"] in ("bm25", "dense"):
                assert len(record["retrieved"]) == min(2, scopes[record["article"]]["num_paragraphs"])
                assert record["gold_retrieved"] == (record["paragraph_index"] in record["retrieved"])
                assert record["ttft_s"] >= record["retrieval_s"] > 0


def test_it_reports_parity_variants_and_sizes(fake_results):
    checks = fake_results["checks"]
    assert checks["parity_all_identical"] is True  # the fake answers the same from cartridge and text
    assert checks["parity_questions"] == 10
    assert checks["q8_within_tolerance"] is True
    for budget in fake_results["budgets"]:
        assert set(budget["agreement"]) == {"q8", "q4", "bf16", "bf16r"}
        for scope in budget["scopes"]:
            assert set(scope["size_bytes"]) == {"f32", "q8", "q4", "bf16", "bf16r"}
            assert all(size > 0 for size in scope["size_bytes"].values())
        assert budget["size_ratio"]["f32"] == 1.0


def test_it_checks_each_budget_draws_from_enough_articles_and_lists_differing_answers(fake_results):
    checks = fake_results["checks"]
    assert checks["min_articles_per_budget"] == 10
    assert [(r["budget"], r["enough"]) for r in checks["articles_per_budget"]] == [(300, False), (600, False)]
    for row, budget in zip(checks["articles_per_budget"], fake_results["budgets"], strict=True):
        assert row["num_articles"] == budget["num_articles"] >= 2
    for label in ("q8", "q4", "bf16", "bf16r"):
        expected = [r["qid"] for b in fake_results["budgets"] for r in b["agreement_records"][label] if not r["identical"]]
        assert [r["qid"] for r in checks["differing"][label]] == expected


def test_the_report_names_differing_answers_with_their_first_token_kl():
    from kvengine.kveval.report import checks_section

    results = {"checks": {"divergence": {}, "cartridge_f1_vs_retrieval": [], "min_articles_per_budget": 10,
                          "articles_per_budget": [{"budget": 1024, "num_articles": 12, "enough": True}],
                          "differing": {"q8": [{"budget": 1024, "qid": "abc", "first_token": False, "first_token_kl": 0.25}]}},
               "budgets": []}
    text = checks_section(results)
    assert "1024 tokens: scopes drawn from 12 articles (target: >= 10): **yes**" in text
    assert "q8: whole answers that differ from the main cartridge's (1): abc (1024 tok, first token differs, first-token KL 2.50e-01)" in text


def test_it_writes_json_markdown_and_png_charts(fake_results, tmp_path):
    paths = write_report(fake_results, tmp_path, command="python -m kvengine.kveval --backend fake")
    loaded = json.loads(paths["json"].read_text())
    assert loaded["command"] == "python -m kvengine.kveval --backend fake"
    assert loaded["checks"] == json.loads(json.dumps(fake_results["checks"]))
    markdown = paths["markdown"].read_text()
    assert "| 600 | cartridge | 6 |" in markdown
    assert "dense top-k text" in markdown and "(10/10)" in markdown
    for key in ("accuracy_png", "latency_png"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_token_agreement_counts_matching_positions_over_the_longer_answer():
    assert token_agreement([1, 2, 3], [1, 2, 3]) == 1.0
    assert token_agreement([1, 2, 3, 4], [1, 9, 3]) == 0.5
    assert token_agreement([], []) == 1.0


@pytest.mark.parametrize(
    ("options", "field"),
    [({"dtype": "f8"}, "dtype"), ({"quants": ("q3",)}, "quants"), ({"modes": ("text",)}, "modes"),
     ({"budgets": (10,)}, "budgets"), ({"questions": (1, 2, 3)}, "questions"), ({"top_k": 0}, "top_k"),
     ({"question_template": "no slot"}, "question_template"), ({"articles": (1, 1, 1)}, "articles"),
     ({"threads": 0}, "threads")],
)
def test_it_refuses_bad_options_naming_the_field(options, field):
    with pytest.raises(ConfigError, match=f"`{field}`"):
        EvalConfig(**options)


def test_the_module_command_has_help():
    result = subprocess.run([sys.executable, "-m", "kvengine.kveval", "--help"], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0
    for option in ("--model", "--dtype", "--quants", "--budgets", "--questions", "--articles", "--top-k",
                   "--max-new-tokens", "--out", "--squad-file", "--data-dir", "--threads"):
        assert option in result.stdout


def test_the_eval_package_never_imports_django():
    for path in (ROOT / "kvengine" / "kveval").glob("*.py"):
        for line in path.read_text().splitlines():
            assert not line.lstrip().startswith(("import django", "from django", "import rest_framework",
                                                  "from rest_framework", "import celery", "from celery")), path


def test_it_packs_below_the_context_window_so_question_and_answer_still_fit():
    from kvengine.fake import FakeKvBackend
    from kvengine.kveval.runner import QUESTION_ROOM_TOKENS, BackendPool

    config = EvalConfig(backend="fake", budgets=(600,), questions=(2,), articles=(1,), max_new_tokens=32,
                        quants=(), compare_dtypes=(), modes=("cartridge", "text"))
    pool = BackendPool(config, factory=lambda name, **options: FakeKvBackend(max_context_tokens=400, **options))
    run = run_eval(config, load_squad(FIXTURE), pool=pool, progress=False, log=lambda _: None)
    (budget,) = run.budgets
    assert budget["budget"] == 600  # reported under the nominal budget
    assert all(s["num_tokens"] <= 400 - 32 - QUESTION_ROOM_TOKENS for s in budget["scopes"])
    assert budget["parity"]["mismatched_qids"] == []
