"""Batch append: up to 1,000 memories in one transaction, all or nothing, per-item idempotency and results."""
from __future__ import annotations

import pytest

from memories.models import LogHead, Memory, MemoryKey, Subject
from memories.selectors import log_head, scope_memories_open
from memories.services import MAX_BATCH_ITEMS, memories_append_batch, memory_append, subject_shred

pytestmark = pytest.mark.django_db

URL = "/api/v1/scopes/scope-a/memories/batch/"


@pytest.fixture
def client_a(alice, api_client_for):
    return api_client_for(alice)


def test_a_batch_gets_consecutive_seqs_in_item_order_and_a_result_per_item(client_a):
    items = [
        {"content": "The spare key is under the mat.", "idempotency_key": "k1"},
        {"content": "Dana's locker code is 4417.", "subject": "dana", "idempotency_key": "k2", "metadata": {"src": "chat"}},
        {"content": "The cat is called Miso."},
    ]
    r = client_a.post(URL, {"items": items}, format="json")
    assert r.status_code == 201, r.json()
    body = r.json()
    assert body["num_created"] == 3 and body["num_existing"] == 0
    assert [(i["index"], i["status"], i["memory"]["seq"]) for i in body["items"]] == [
        (0, "created", 1), (1, "created", 2), (2, "created", 3)
    ]
    assert body["items"][1]["memory"]["metadata"] == {"src": "chat"} and body["items"][1]["memory"]["subject"] == "dana"
    assert [m.text for m in scope_memories_open(scope=Memory.objects.get(seq=1).scope)] == [i["content"] for i in items]
    # every memory has its own key row
    assert sorted(MemoryKey.objects.values_list("memory_id", flat=True)) == [1, 2, 3]

    # the same batch again: the keyed items are answered, the unkeyed one is a new memory
    again = client_a.post(URL, {"items": items}, format="json")
    assert again.status_code == 201
    assert [(i["status"], i["memory"]["seq"]) for i in again.json()["items"]] == [
        ("existing", 1), ("existing", 2), ("created", 4)
    ]
    # only keyed items: nothing new, 200
    only_keyed = client_a.post(URL, {"items": items[:2]}, format="json")
    assert only_keyed.status_code == 200 and only_keyed.json()["num_existing"] == 2
    assert log_head() == 4


def test_a_bad_item_refuses_the_whole_batch_names_each_one_and_leaves_no_gap(client_a, scope_a):
    items = [
        {"content": "fine"},
        {"content": "   "},
        {"content": "also fine", "metadata": {"a": {"b": {"c": {"d": {"e": 1}}}}}},
        {"content": "fine too", "subject": "bob\u200b"},
        {"content": "x", "colour": "red"},
    ]
    r = client_a.post(URL, {"items": items}, format="json")
    assert r.status_code == 400, r.json()
    fields = [e["field"] for e in r.json()["extra"]["errors"]]
    assert fields == ["items[1].content", "items[2].metadata.a.b.c.d", "items[3].subject", "items[4].colour"]
    assert "items[1].content" in r.json()["message"]
    assert Memory.objects.count() == 0 and not LogHead.objects.filter(head__gt=0).exists()
    # nothing lost, nothing taken: the next append gets seq 1
    assert memory_append(scope=scope_a, content="first").seq == 1


def test_a_key_repeated_in_a_batch_is_one_memory_or_a_conflict(client_a):
    same = {"content": "Standup is at 9.", "idempotency_key": "dup"}
    r = client_a.post(URL, {"items": [same, {"content": "other"}, same]}, format="json")
    assert r.status_code == 201
    assert [(i["status"], i["memory"]["seq"]) for i in r.json()["items"]] == [("created", 1), ("created", 2), ("existing", 1)]
    r = client_a.post(URL, {"items": [{"content": "a", "idempotency_key": "x"}, {"content": "b", "idempotency_key": "x"}]},
                      format="json")
    assert r.status_code == 409 and r.json()["extra"]["errors"][0]["field"] == "items[1].idempotency_key"
    assert Memory.objects.count() == 2


def test_a_key_reused_with_other_content_or_metadata_refuses_the_batch(client_a, scope_a):
    memory_append(scope=scope_a, content="original", idempotency_key="k", metadata={"v": 1})
    for item in ({"content": "changed", "idempotency_key": "k", "metadata": {"v": 1}},
                 {"content": "original", "idempotency_key": "k", "metadata": {"v": 2}}):
        r = client_a.post(URL, {"items": [{"content": "new"}, item]}, format="json")
        assert r.status_code == 409, r.json()
        assert r.json()["extra"]["errors"][0]["field"] == "items[1].idempotency_key"
    assert Memory.objects.count() == 1


def test_an_erased_subject_refuses_the_batch_naming_the_item(client_a, scope_a):
    memory_append(scope=scope_a, subject="dana", content="Dana parks in bay 12.")
    subject_shred(subject=Subject.objects.get(external_id="dana"))
    r = client_a.post(URL, {"items": [{"content": "ok"}, {"content": "Dana moved.", "subject": "dana"}]}, format="json")
    assert r.status_code == 409
    assert r.json()["extra"]["errors"] == [
        {"index": 1, "field": "items[1].subject", "message": r.json()["extra"]["errors"][0]["message"], "status": 409}
    ]
    assert Memory.objects.count() == 1


def test_it_takes_1_to_1000_items(client_a):
    assert client_a.post(URL, {"items": []}, format="json").json()["extra"]["fields"]["items"]
    too_many = [{"content": f"m{i}"} for i in range(MAX_BATCH_ITEMS + 1)]
    r = client_a.post(URL, {"items": too_many}, format="json")
    assert r.status_code == 400 and "items" in r.json()["extra"]["fields"]
    assert client_a.post(URL, {"items": "nope"}, format="json").status_code == 400
    assert Memory.objects.count() == 0


@pytest.mark.postgres  # SQLite splits a 1,000-row insert into chunks (its bound-parameter limit)
def test_a_full_batch_of_1000_is_one_transaction_with_a_fixed_number_of_queries(scope_a, django_assert_max_num_queries):
    # The first append of a process checks the master keys once and may restore the log's head row (a flush by an
    # earlier transactional test removes it): warm both up, so the count below is what every batch costs.
    memories_append_batch(scope=scope_a, items=[{"content": "warm-up", "subject": "p0"}])
    items = [{"content": f"fact {i}", "subject": f"p{i % 7}", "idempotency_key": f"k{i}"} for i in range(MAX_BATCH_ITEMS)]
    # BEGIN, keys, counter, scope, subjects, new subjects, insert(s), the search index, COMMIT
    with django_assert_max_num_queries(13):
        outcomes = memories_append_batch(scope=scope_a, items=items)
    assert [o.memory.seq for o in outcomes] == list(range(2, MAX_BATCH_ITEMS + 2)) and all(o.created for o in outcomes)
    assert [m.text for m in scope_memories_open(scope=scope_a)][:4] == ["warm-up", "fact 0", "fact 1", "fact 2"]
    assert Subject.objects.filter(scope=scope_a).count() == 7


def test_another_scopes_client_cannot_batch_into_it(charlie, api_client_for, scope_a):
    r = api_client_for(charlie).post(URL, {"items": [{"content": "sneaky"}]}, format="json")
    assert r.status_code == 404 and Memory.objects.count() == 0


def test_the_single_append_is_a_batch_of_one_with_its_own_field_names(client_a):
    r = client_a.post("/api/v1/scopes/scope-a/memories/", {"content": "   "}, format="json")
    assert r.status_code == 400 and r.json()["extra"]["field"] == "content"
    r = client_a.post("/api/v1/scopes/scope-a/memories/", {"content": "x", "metadata": []}, format="json")
    assert r.status_code == 400
    r = client_a.post("/api/v1/scopes/scope-a/memories/", {"content": "one", "metadata": {"tag": "t"}}, format="json")
    assert r.status_code == 201 and r.json()["metadata"] == {"tag": "t"}
    assert MemoryKey.objects.filter(memory_id=r.json()["seq"]).exists()
