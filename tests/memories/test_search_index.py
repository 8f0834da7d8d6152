"""The search index: kept by appends and erasures (never rebuilt per question), scored exactly as bm25s scores,
per scope, with no plaintext term stored."""
from __future__ import annotations

import random

import pytest
from django.db import connection, transaction

from kvengine.retrieval import Bm25
from memories import search_index
from memories.models import Memory, SearchIndex, SearchPosting
from memories.selectors import memories_search, memory_search
from memories.services import (
    erasure_request_file,
    erasure_request_process,
    memories_append_batch,
    memory_forget_file,
    scope_create,
    scope_delete_file,
    search_index_backfill,
)

pytestmark = pytest.mark.django_db

WORDS = ("key flowerpot garage car blue red drawer fridge wifi password noodle bar lunch friday dana erin "
         "level door the a of on in is bike badge umbrella laptop keys cars parked parking running runs").split()


def _corpus(num: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14))) + "." for _ in range(num)]


def _rows(sql: str, params: list) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _seq_in(seqs: list[int]) -> tuple[str, list[int]]:
    """``seq IN (...)`` and its parameters: raw SQL that PostgreSQL and SQLite both read."""
    return f"seq IN ({', '.join(['%s'] * len(seqs))})", list(seqs)


def _postings_of(seqs: list[int]) -> int:
    """Index rows (postings and documents) that name any of ``seqs``, counted by raw SQL."""
    where, params = _seq_in(seqs)
    return (_rows(f"SELECT count(*) FROM memories_searchposting WHERE {where}", params)[0][0]
            + _rows(f"SELECT count(*) FROM memories_searchdocument WHERE {where}", params)[0][0])


def test_it_finds_a_memory_as_soon_as_its_append_commits(scope_a, append):
    append(scope_a, "Dana parks her car on level 3.")
    memory = append(scope_a, "The okapi lantern is in the attic.")
    assert [r.seq for r in memory_search(scope=scope_a, query="where is the okapi lantern", k=5)][0] == memory.seq
    assert _postings_of([memory.seq]) == 7  # six distinct words ("the" twice) and the document row


def test_it_ranks_exactly_as_bm25s_does(scope_a):
    texts = _corpus(80, seed=3)
    memories = [o.memory for o in memories_append_batch(scope=scope_a, items=[{"content": t} for t in texts])]
    reference = Bm25(texts, stem=True)
    queries = ["blue key", "the key of the blue car", "noodle noodle bar", "password wifi fridge dana",
               "zebra", "a", "level door erin lunch friday"]
    for query in queries:
        expected = [(memories[i].seq, score) for i, score in reference.ranked(query, 100)]
        got = [(r.seq, r.score) for r in memory_search(scope=scope_a, query=query, k=100)]
        assert [seq for seq, _ in got] == [seq for seq, _ in expected], query
        assert [score for _, score in got] == pytest.approx([score for _, score in expected], rel=1e-5), query


def test_a_filter_chooses_among_the_scopes_memories_without_changing_its_statistics(scope_a):
    texts = _corpus(40, seed=5)
    items = [{"content": t, "subject": "dana" if i % 3 == 0 else None} for i, t in enumerate(texts)]
    memories = [o.memory for o in memories_append_batch(scope=scope_a, items=items)]
    scores = Bm25(texts, stem=True).scores("blue key door")  # as a filter in Lucene: the scope's N, df and avgdl
    kept = sorted((i for i in range(len(texts)) if i % 3 == 0 and scores[i] > 0), key=lambda i: (-scores[i], i))
    result = memories_search(scope=scope_a, query="blue key door", top_k=100, subject="dana")
    assert [h.seq for h in result.hits] == [memories[i].seq for i in kept]
    assert [h.score for h in result.hits] == pytest.approx([scores[i] for i in kept], rel=1e-5)


def test_as_of_ranks_with_the_statistics_of_that_head(scope_a):
    texts = _corpus(40, seed=6)
    memories = [o.memory for o in memories_append_batch(scope=scope_a, items=[{"content": t} for t in texts])]
    head = memories[19].seq
    reference = Bm25(texts[:20], stem=True).ranked("blue key door", 100)
    result = memories_search(scope=scope_a, query="blue key door", top_k=100, as_of=head)
    assert [h.seq for h in result.hits] == [memories[i].seq for i, _ in reference] and result.as_of == head
    assert [h.score for h in result.hits] == pytest.approx([score for _, score in reference], rel=1e-5)


def test_a_processs_cached_postings_follow_appends_and_every_erasure(alice, scope_a):
    texts = _corpus(60, seed=8)
    memories = [o.memory for o in memories_append_batch(scope=scope_a, items=[{"content": t} for t in texts])]
    query = "the blue key of the car"
    memory_search(scope=scope_a, query=query, k=100)  # this process now holds the query's postings
    # appended: read as a delta past the head it held
    texts.append("the blue key of the car, the blue car")
    memories += [o.memory for o in memories_append_batch(scope=scope_a, items=[{"content": texts[-1]}])]
    # forgotten: the erasure moves the generation; the copy this process held is dropped, as any process's would be
    memory_forget_file(scope=scope_a, seq=memories[0].seq, requested_by=alice)
    live = list(range(1, len(texts)))
    expected = Bm25([texts[i] for i in live], stem=True).ranked(query, 100)
    got = memory_search(scope=scope_a, query=query, k=100)
    assert [r.seq for r in got] == [memories[live[i]].seq for i, _ in expected]
    assert [r.score for r in got] == pytest.approx([score for _, score in expected], rel=1e-5)


def test_forgetting_a_memory_removes_its_postings_and_hits(alice, scope_a, append):
    kept = append(scope_a, "The spare key is under the blue flowerpot.")
    gone = append(scope_a, "The okapi lantern key is in the attic.")
    memory_forget_file(scope=scope_a, seq=gone.seq, requested_by=alice)
    assert _postings_of([gone.seq]) == 0 and _postings_of([kept.seq]) > 0
    assert [r.seq for r in memory_search(scope=scope_a, query="okapi lantern key", k=10)] == [kept.seq]


def test_erasing_a_subject_removes_its_postings_and_hits(alice, scope_a, append):
    kept = append(scope_a, "Erin keeps the okapi lantern.", "erin")
    gone = [append(scope_a, "Dana keeps the okapi lantern.", "dana"), append(scope_a, "Dana likes okapis.", "dana")]
    request = erasure_request_file(subject="dana", requested_by=alice, reason="asked", scope=scope_a)
    erasure_request_process(erasure_request=request)
    assert _postings_of([m.seq for m in gone]) == 0 and _postings_of([kept.seq]) > 0
    assert [h.seq for h in memories_search(scope=scope_a, query="dana okapi lantern").hits] == [kept.seq]


def test_deleting_a_scope_removes_every_posting_and_shreds_its_index_key(operator, scope_a, scope_c, append):
    from django.contrib.auth.models import Permission

    operator.user_permissions.add(Permission.objects.get(codename="delete_scope"))
    operator = type(operator).objects.get(pk=operator.pk)  # permissions are cached per instance
    memories = [append(scope_a, f"Fact {i} about the okapi lantern.") for i in range(5)]
    other = append(scope_c, "The okapi lantern of scope C.")
    scope_delete_file(scope=scope_a, requested_by=operator)
    assert _rows("SELECT count(*) FROM memories_searchposting WHERE scope_id = %s", [scope_a.pk])[0][0] == 0
    assert _rows("SELECT count(*) FROM memories_searchdocument WHERE scope_id = %s", [scope_a.pk])[0][0] == 0
    assert _postings_of([m.seq for m in memories]) == 0 and _postings_of([other.seq]) > 0
    key = SearchIndex.objects.get(scope=scope_a)
    assert key.wrapped_key is None and key.shredded_at is not None
    assert memory_search(scope=scope_a, query="okapi lantern", k=10) == []


def test_another_scopes_memories_never_leak_into_a_search(alice, charlie, scope_a, scope_c, append, api_client_for):
    secret = append(scope_a, "The okapi lantern code is 5521.")
    mine = append(scope_c, "Charlie's notes mention a lantern.")
    response = api_client_for(charlie).post(
        "/api/v1/scopes/scope-c/search/", data={"query": "okapi lantern code 5521", "top_k": 100}, format="json"
    )
    assert response.status_code == 200 and [h["seq"] for h in response.json()["results"]] == [mine.seq]
    assert [r.seq for r in memory_search(scope=scope_c, query="okapi lantern code 5521", k=100)] == [mine.seq]
    assert secret.seq not in [r.seq for r in memory_search(scope=scope_c, query="okapi", k=100)]


def test_a_term_has_another_digest_in_another_scope_and_no_plaintext_is_stored(scope_a, scope_c, append):
    a = append(scope_a, "lantern")
    c = append(scope_c, "lantern")
    where, params = _seq_in([a.seq, c.seq])
    digests = {seq: term for seq, term in _rows(f"SELECT seq, term FROM memories_searchposting WHERE {where}", params)}
    assert digests[a.seq] != digests[c.seq]  # one scope's postings cannot be matched against another's
    assert digests[a.seq] == search_index.term_digest(search_index.index_key_for_read(scope=scope_a), "lantern")
    dump = repr(_rows("SELECT * FROM memories_searchposting", [])) + repr(_rows("SELECT * FROM memories_searchdocument", []))
    assert "lantern" not in dump


def test_a_ranking_is_one_query_once_the_process_holds_its_terms(scope_a, append, django_assert_num_queries):
    memories_append_batch(scope=scope_a, items=[{"content": t} for t in _corpus(200, seed=9)])
    memory_search(scope=scope_a, query="the blue key", k=1)  # the index key, then the postings of these terms
    okapi = append(scope_a, "the okapi lantern")
    # one statement: the weights with the scope's head, and the postings appended past what this process holds
    with django_assert_num_queries(1):
        assert [r.seq for r in memory_search(scope=scope_a, query="the okapi", k=1)] == [okapi.seq]
    with django_assert_num_queries(1):  # nothing new: the same statement reads no posting
        ranked = memory_search(scope=scope_a, query="the okapi the", k=10)
    assert len(ranked) == 10 and ranked[0].seq == okapi.seq


@pytest.mark.postgres  # one statement is PostgreSQL's path; SQLite's portable one checks the key and writes by table
def test_an_append_adds_one_statement_for_the_index(scope_a, append, django_assert_num_queries):
    append(scope_a, "warms this process's scope and index keys")
    # BEGIN, the counter, the memory and its key (one statement), the index (one statement), COMMIT
    with django_assert_num_queries(5):
        append(scope_a, "The okapi lantern is in the attic.")


def test_the_backfill_indexes_memories_written_before_the_index_and_never_erased_ones(alice, scope_a, append):
    memories = [append(scope_a, f"Note {i} on the okapi lantern.") for i in range(4)]
    forgotten = memories[3]
    # as an upgrade finds them: in the log, not in the index
    for memory in memories[:3]:
        search_index.memories_unindex(seqs=[memory.seq])
    memory_forget_file(scope=scope_a, seq=forgotten.seq, requested_by=alice)
    assert memory_search(scope=scope_a, query="okapi", k=10) == []
    assert search_index_backfill(scope=scope_a) == 3
    assert sorted(r.seq for r in memory_search(scope=scope_a, query="okapi", k=10)) == [m.seq for m in memories[:3]]
    assert _postings_of([forgotten.seq]) == 0
    assert search_index_backfill() == 0  # safe to repeat


def test_a_new_scope_with_nothing_indexed_finds_nothing(db):
    scope = scope_create(name="empty-scope")
    assert memory_search(scope=scope, query="anything", k=5) == []
    assert memories_search(scope=scope, query="anything").hits == []
    assert Memory.objects.filter(scope=scope).count() == 0


def test_the_backfill_command_reports_what_it_indexed(scope_a, append):
    from io import StringIO

    from django.core.management import call_command

    memory = append(scope_a, "The okapi lantern.")
    search_index.memories_unindex(seqs=[memory.seq])
    out = StringIO()
    call_command("search_index_backfill", "--scope", "scope-a", stdout=out)
    assert out.getvalue().strip() == "indexed 1 memory"
    assert [r.seq for r in memory_search(scope=scope_a, query="okapi", k=1)] == [memory.seq]


def test_it_indexes_under_the_stored_key_after_the_transaction_that_created_a_key_rolled_back(scope_a, append):
    # the first append of a scope creates its index key; rolled back, this process still held the key it made
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        append(scope_a, "The umbrella is in the car.")
        raise RuntimeError("the caller's transaction fails after the append")
    assert not SearchIndex.objects.filter(scope_id=scope_a.pk).exists()
    memory = append(scope_a, "The umbrella is in the garage.")
    assert [hit.seq for hit in memory_search(scope=scope_a, query="umbrella garage", k=5)] == [memory.seq]


def test_words_are_stemmed_in_the_index_and_the_query(scope_a, append):
    cat = append(scope_a, "My cat sleeps on the sofa.")
    parking = append(scope_a, "Parking is free on Sundays.")
    append(scope_a, "The dog barks.")
    assert [r.seq for r in memory_search(scope=scope_a, query="cats", k=5)] == [cat.seq]
    assert [r.seq for r in memory_search(scope=scope_a, query="where was it parked", k=5)] == [parking.seq]
    key = search_index.index_key_for_read(scope=scope_a)
    stored = set(SearchPosting.objects.filter(seq=cat.seq).values_list("term", flat=True))
    assert search_index.term_digest(key, "sleep") in stored and search_index.term_digest(key, "sleeps") not in stored


def _build_unstemmed(scope, memories: list, texts: list[str]) -> None:
    """Index ``memories`` as an index built before stemming holds them: tokenizer 1, unstemmed terms."""
    search_index.memories_unindex(seqs=[m.seq for m in memories])
    SearchIndex.objects.filter(scope=scope).update(tokenizer=1)
    with transaction.atomic():
        search_index.documents_index(scope_id=scope.pk, texts=[
            search_index.IndexedText(m.seq, m.subject_id, m.created_at, t) for m, t in zip(memories, texts, strict=True)
        ])


def test_an_index_built_unstemmed_answers_unstemmed_until_the_backfill_rebuilds_it(scope_a, append):
    texts = _corpus(40, seed=11) + ["the cat sleeps", "two cats"]
    memories = [o.memory for o in memories_append_batch(scope=scope_a, items=[{"content": t} for t in texts])]
    assert memory_search(scope=scope_a, query="cats", k=5)  # this process assumes (and caches) the stemmed one
    _build_unstemmed(scope_a, memories, texts)
    key = search_index.index_key_for_read(scope=scope_a)
    assert search_index.term_digest(key, "cats") in set(SearchPosting.objects.filter(seq=memories[-1].seq)
                                                        .values_list("term", flat=True))
    # an append to the old index is tokenized as that index is, so it stays one consistent index
    texts.append("the cats of the garage")
    memories.append(append(scope_a, texts[-1]))
    for query in ("cats", "the blue keys of the cars", "parked running"):
        expected = [(memories[i].seq, score) for i, score in Bm25(texts).ranked(query, 100)]
        got = [(r.seq, r.score) for r in memory_search(scope=scope_a, query=query, k=100)]
        assert [seq for seq, _ in got] == [seq for seq, _ in expected], query
        assert [score for _, score in got] == pytest.approx([score for _, score in expected], rel=1e-5), query
    assert search_index_backfill(scope=scope_a) == len(texts)
    assert SearchIndex.objects.get(scope=scope_a).tokenizer == 2
    for query in ("cats", "the blue keys of the cars", "parked running"):
        expected = [(memories[i].seq, score) for i, score in Bm25(texts, stem=True).ranked(query, 100)]
        got = [(r.seq, r.score) for r in memory_search(scope=scope_a, query=query, k=100)]
        assert [seq for seq, _ in got] == [seq for seq, _ in expected], query
        assert [score for _, score in got] == pytest.approx([score for _, score in expected], rel=1e-5), query
    assert search_index_backfill(scope=scope_a) == 0  # rebuilt once
