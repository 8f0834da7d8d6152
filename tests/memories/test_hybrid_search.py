"""Hybrid search (MNESIO_SEARCH_RETRIEVER=hybrid): BM25 fused by reciprocal rank with all-MiniLM-L6-v2 similarity
over the scope's candidates, embedded in the process and never stored; a model-free web tier stays on BM25."""
from __future__ import annotations

import numpy as np
import pytest

from kvengine.retrieval import rrf_scores
from memories import search_dense
from memories.selectors import memories_search, memory_search
from tests.support.encoders import ConceptEncoder

pytestmark = pytest.mark.django_db


@pytest.fixture
def hybrid(settings, monkeypatch):
    settings.MNESIO_SEARCH_RETRIEVER = "hybrid"
    settings.MNESIO_WEB_LOADS_MODEL = True
    fake = ConceptEncoder()
    monkeypatch.setattr(search_dense, "_encoder", fake)
    monkeypatch.setattr(search_dense, "_held", {})
    return fake


PETS = ["Luna sleeps on the sofa all afternoon.", "The pet shop on Main Street closes at six.",
        "Rex the puppy chewed a shoe.", "Dana parks her car on level 3 of the garage."]


@pytest.fixture
def pets(scope_a, append):
    return [
        append(scope_a, "Luna sleeps on the sofa all afternoon.", "dana"),
        append(scope_a, "The pet shop on Main Street closes at six."),
        append(scope_a, "Rex the puppy chewed a shoe.", "erin"),
        append(scope_a, "Dana parks her car on level 3 of the garage.", "dana"),
    ]


def test_it_finds_by_meaning_what_bm25_alone_misses(hybrid, scope_a, pets):
    assert [r.seq for r in memory_search(scope=scope_a, query="feline", k=5, retriever="bm25")] == []
    ranked = memory_search(scope=scope_a, query="feline", k=2, retriever="hybrid")
    assert ranked[0].seq == pets[0].seq
    # the fused score: dense rank 1, no BM25 rank
    assert ranked[0].score == pytest.approx(rrf_scores([[], [pets[0].seq]])[pets[0].seq])


def test_it_fuses_the_bm25_and_dense_rankings_by_reciprocal_rank(hybrid, scope_a, pets):
    got = memory_search(scope=scope_a, query="the puppy pet", k=4, retriever="hybrid")
    bm25 = [r.seq for r in memory_search(scope=scope_a, query="the puppy pet", k=100, retriever="bm25")]
    similarity = hybrid.encode(PETS) @ hybrid.encode(["the puppy pet"])[0]
    dense = [pets[i].seq for i in np.lexsort((np.arange(4), -similarity))]
    expected = rrf_scores([bm25, dense])
    order = sorted(expected, key=lambda seq: (-expected[seq], seq))[:4]
    assert [r.seq for r in got] == order and [r.score for r in got] == pytest.approx([expected[s] for s in order])


def test_the_filters_and_as_of_choose_the_dense_candidates_too(hybrid, scope_a, pets, append):
    append(scope_a, "A kitten was adopted later.")
    result = memories_search(scope=scope_a, query="feline", subject="erin")
    assert [h.seq for h in result.hits] == [pets[2].seq] and result.retriever == "hybrid"
    assert pets[0].seq not in [h.seq for h in memories_search(scope=scope_a, query="feline", since=pets[1].created_at).hits]
    assert [h.seq for h in memories_search(scope=scope_a, query="kitten", as_of=pets[-1].seq, top_k=1).hits] == [pets[0].seq]


def test_a_forgotten_memory_is_never_a_hybrid_hit_and_its_embedding_is_dropped(alice, hybrid, scope_a, pets):
    from memories.services import memory_forget_file

    assert memory_search(scope=scope_a, query="feline", k=1, retriever="hybrid")[0].seq == pets[0].seq
    held = search_dense._held[(scope_a.pk, scope_a.created_at)]
    assert pets[0].seq in held.vectors
    memory_forget_file(scope=scope_a, seq=pets[0].seq, requested_by=alice)
    assert pets[0].seq not in [r.seq for r in memories_search(scope=scope_a, query="feline").hits]
    assert pets[0].seq not in search_dense._held[(scope_a.pk, scope_a.created_at)].vectors
    assert not any("Luna" in text for text in hybrid.texts[len(pets):])  # the forgotten text was not embedded again


def test_a_process_drops_a_deleted_scopes_embeddings_at_its_next_request_without_searching_it(
    operator, hybrid, scope_a, pets
):
    # the erasure may be another process's: this one never searches the deleted scope again (it is a 404)
    from django.contrib.auth.models import Permission

    from cartridges.engine import cartridges_purge_destroyed
    from memories.services import erasure_request_process, scope_delete_file

    operator.user_permissions.add(Permission.objects.get(codename="delete_scope"))
    memory_search(scope=scope_a, query="feline", k=1, retriever="hybrid")
    assert (scope_a.pk, scope_a.created_at) in search_dense._held
    cartridges_purge_destroyed()  # nothing erased yet: kept
    assert (scope_a.pk, scope_a.created_at) in search_dense._held
    erasure_request_process(erasure_request=scope_delete_file(scope=scope_a, requested_by=operator))
    cartridges_purge_destroyed()  # what every request and task of the process runs first
    assert (scope_a.pk, scope_a.created_at) not in search_dense._held


def test_another_scopes_memories_are_never_hybrid_candidates(hybrid, scope_a, scope_c, pets, append):
    mine = append(scope_c, "My kitten is asleep.")
    assert [h.seq for h in memories_search(scope=scope_c, query="feline").hits] == [mine.seq]


def test_a_model_free_web_process_searches_by_bm25_without_loading_the_encoder(settings, monkeypatch, scope_a, pets,
                                                                                alice, api_client_for):
    settings.MNESIO_SEARCH_RETRIEVER = "hybrid"
    settings.MNESIO_WEB_LOADS_MODEL = False

    def refuse():
        raise AssertionError("a model-free web process loaded the dense encoder")

    monkeypatch.setattr(search_dense, "encoder", refuse)
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/search/", {"query": "pet shop"}, format="json")
    assert response.status_code == 200 and response.json()["retriever"] == "bm25"
    assert [h["seq"] for h in response.json()["results"]] == [pets[1].seq]


def test_an_unknown_retriever_is_refused_naming_it(scope_a, pets):
    from core.errors import MnesioError

    with pytest.raises(MnesioError, match="`retriever` has to be one of"):
        memory_search(scope=scope_a, query="pet", k=5, retriever="dense")


def test_memory_search_ranks_by_bm25_unless_asked_whatever_the_setting(hybrid, scope_a, pets):
    # routed answers take BM25's top k (cartridges.services.routed_answer)
    assert memory_search(scope=scope_a, query="feline", k=5) == []
    assert memories_search(scope=scope_a, query="feline").retriever == "hybrid"


@pytest.mark.model
def test_feline_pet_finds_the_cat_with_the_real_encoder_under_hybrid_and_not_under_bm25(settings, monkeypatch, scope_a,
                                                                                          append, alice, api_client_for):
    settings.MNESIO_SEARCH_RETRIEVER = "hybrid"
    settings.MNESIO_WEB_LOADS_MODEL = True
    monkeypatch.setattr(search_dense, "_held", {})
    cat = append(scope_a, "Luna, my cat, sleeps on the sofa all afternoon.")
    for text in ("Dana parks her car on level 3.", "The wifi password is on the fridge.",
                 "Lunch on Fridays is at the noodle bar.", "Erin's bike is blue."):
        append(scope_a, text)
    client = api_client_for(alice)
    body = client.post("/api/v1/scopes/scope-a/search/", {"query": "feline pet", "top_k": 1}, format="json").json()
    assert body["retriever"] == "hybrid" and [h["seq"] for h in body["results"]] == [cat.seq]
    settings.MNESIO_SEARCH_RETRIEVER = "bm25"
    body = client.post("/api/v1/scopes/scope-a/search/", {"query": "feline pet", "top_k": 1}, format="json").json()
    assert body["retriever"] == "bm25" and body["results"] == []
