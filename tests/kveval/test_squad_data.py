"""SQuAD loading, fetching from the bigbench archive, and packing scopes by token budget."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from kvengine.fake import FakeKvBackend
from kvengine.kveval.data import (
    SQUAD_FILENAME,
    SQUAD_MEMBER,
    build_scopes,
    ensure_squad_file,
    load_squad,
    pack_scope,
    sample_questions,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "squad_subset" / "squad_v1.1_dev_subset.json"


@pytest.fixture(scope="module")
def articles():
    return load_squad(FIXTURE)


def test_it_loads_articles_paragraphs_and_questions(articles):
    assert [a.title for a in articles] == ["Normans", "Amazon_rainforest", "Black_Death"]
    normans = articles[0]
    assert len(normans.paragraphs) == 6
    first = normans.questions[0]
    assert first.question == "In what country is Normandy located?"
    assert first.answers == ("France",)  # three identical answers collapse to one
    assert first.paragraph_index == 0
    assert all(0 <= q.paragraph_index < 6 for q in normans.questions)


def test_it_packs_a_prefix_of_paragraphs_up_to_the_budget(articles):
    count = FakeKvBackend().count_tokens
    for budget in (300, 600, 1200):
        for article in articles:
            scope = pack_scope(article, budget, count)
            n = len(scope.paragraphs)
            assert scope.paragraphs == article.paragraphs[:n]
            assert scope.num_tokens == (count(list(scope.paragraphs)) if n else 0)
            assert scope.num_tokens <= budget
            if n < len(article.paragraphs):  # the next paragraph would not have fitted
                assert count([*scope.paragraphs, article.paragraphs[n]]) > budget
            assert scope.questions and all(q.paragraph_index < n for q in scope.questions)
            assert len(scope.questions) == sum(q.paragraph_index < n for q in article.questions)


def test_it_skips_articles_too_short_to_fill_the_budget(articles):
    count = FakeKvBackend().count_tokens
    scopes = build_scopes(articles, 1200, count, num_articles=3)
    assert all(s.num_tokens >= 0.7 * 1200 for s in scopes)
    with pytest.raises(ValueError, match="budgets"):
        build_scopes(articles, 100_000, count, num_articles=1)


def test_it_samples_the_same_questions_for_the_same_seed_spread_over_scopes(articles):
    count = FakeKvBackend().count_tokens
    scopes = build_scopes(articles, 600, count, num_articles=2)
    picked = sample_questions(scopes, 6, seed=7)
    assert [q.qid for _, q in picked] == [q.qid for _, q in sample_questions(scopes, 6, seed=7)]
    assert [s.article for s, _ in picked].count(scopes[0].article) == 3
    assert len({q.qid for _, q in picked}) == 6
    assert all(q in s.questions for s, q in picked)


def test_it_extracts_only_the_squad_member_from_the_bigbench_archive(tmp_path):
    payload = json.dumps({"version": "1.1", "data": []}).encode()
    archive = tmp_path / "bigbench-1.0.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in ((SQUAD_MEMBER, payload), ("bigbench-1.0.0/setup.py", b"print()")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path = ensure_squad_file(data_dir=tmp_path, log=lambda _: None)
    assert path == tmp_path / SQUAD_FILENAME
    assert path.read_bytes() == payload
    assert not archive.exists()  # the 360 MB archive is not kept
    assert sorted(p.name for p in tmp_path.iterdir()) == [SQUAD_FILENAME]
    assert ensure_squad_file(data_dir=tmp_path, log=lambda _: None) == path  # cached: no second fetch


def test_it_refuses_a_missing_squad_file_naming_the_option(tmp_path):
    with pytest.raises(FileNotFoundError, match="--squad-file"):
        ensure_squad_file(squad_file=tmp_path / "nope.json")


def test_it_refuses_a_file_that_is_not_squad(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a SQuAD file"):
        load_squad(path)
