"""Listing by filter without a query: GET /api/v1/scopes/<scope>/memories/ filtered by subject, creation time and
metadata (exact top-level JSON values), in log order and paginated like the unfiltered list."""
from __future__ import annotations

import json

import pytest

from tests.support.errors import assert_error

pytestmark = pytest.mark.django_db

URL = "/api/v1/scopes/scope-a/memories/"


@pytest.fixture
def notes(scope_a):
    """Six memories of scope A: dana's and erin's, notes and todos (metadata), one with no metadata."""
    from memories.services import memories_append_batch

    items = [
        {"content": "Dana parks on level 3.", "subject": "dana", "metadata": {"kind": "note", "priority": 1}},
        {"content": "Erin likes noodles.", "subject": "erin", "metadata": {"kind": "note"}},
        {"content": "Buy a spare key.", "subject": "dana", "metadata": {"kind": "todo", "priority": 2}},
        {"content": "The wifi password is on the fridge."},
        {"content": "Dana's locker code is 4417.", "subject": "dana", "metadata": {"kind": "note", "pinned": True}},
        {"content": "Call Erin on Friday.", "subject": "erin", "metadata": {"kind": "todo"}},
    ]
    return [o.memory for o in memories_append_batch(scope=scope_a, items=items)]


def _list(client, url=URL, **params):
    query = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in params.items()}
    return client.get(url, query)


def test_it_lists_a_subjects_memories_in_log_order(alice, notes, api_client_for):
    body = _list(api_client_for(alice), subject="dana").json()
    assert [m["seq"] for m in body["results"]] == [notes[0].seq, notes[2].seq, notes[4].seq]
    assert body["count"] == 3 and body["as_of"] == notes[-1].seq
    assert _list(api_client_for(alice), subject="nobody").json()["results"] == []
    assert _list(api_client_for(alice), subject="dana", format="json").json()["count"] == 3  # DRF's own parameter


def test_it_lists_by_metadata_key_and_value_without_a_query(alice, notes, api_client_for):
    client = api_client_for(alice)
    body = _list(client, metadata={"kind": "note"}).json()
    assert [m["content"] for m in body["results"]] == [
        "Dana parks on level 3.", "Erin likes noodles.", "Dana's locker code is 4417.",
    ]
    assert body["results"][0]["metadata"] == {"kind": "note", "priority": 1}
    # exact JSON values, every key given, combined with the other filters
    assert [m["seq"] for m in _list(client, metadata={"kind": "todo", "priority": 2}).json()["results"]] == [notes[2].seq]
    assert _list(client, metadata={"priority": "2"}).json()["results"] == []
    assert [m["seq"] for m in _list(client, metadata={"kind": "todo"}, subject="erin").json()["results"]] == [notes[5].seq]


def test_it_lists_by_creation_time_since_inclusive_until_exclusive(alice, notes, api_client_for):
    client = api_client_for(alice)
    cut = notes[0].created_at.isoformat()
    assert _list(client, since=cut).json()["count"] == 6
    assert _list(client, until=cut).json()["count"] == 0
    later = _list(client, since="2999-01-01T00:00:00Z").json()
    assert later["count"] == 0 and later["results"] == []


def test_a_filtered_list_pages_like_the_list_with_its_filters_and_head_in_the_links(alice, notes, api_client_for):
    client = api_client_for(alice)
    first = _list(client, metadata={"kind": "note"}, limit=2).json()
    assert first["count"] == 3 and [m["seq"] for m in first["results"]] == [notes[0].seq, notes[1].seq]
    assert first["previous"] is None and "metadata=" in first["next"] and f"as_of={notes[-1].seq}" in first["next"]
    client.post(URL, {"content": "A later note.", "metadata": {"kind": "note"}}, format="json")
    second = client.get(first["next"]).json()  # the head pinned in the link: the later note is not on this view
    assert [m["seq"] for m in second["results"]] == [notes[4].seq] and second["next"] is None
    assert _list(client, metadata={"kind": "note"}).json()["count"] == 4


def test_an_erased_memory_never_matches_a_metadata_filter(alice, scope_a, notes, api_client_for):
    from memories.services import memory_forget_file

    memory_forget_file(scope=scope_a, seq=notes[0].seq, requested_by=alice)
    client = api_client_for(alice)
    assert [m["seq"] for m in _list(client, metadata={"kind": "note"}).json()["results"]] == [notes[1].seq, notes[4].seq]
    # the subject filter is SQL: the forgotten memory lists, erased, as it does unfiltered
    dana = _list(client, subject="dana").json()["results"]
    assert [(m["seq"], m["erased"], m["content"]) for m in dana][0] == (notes[0].seq, True, None)


def test_another_tenants_scope_is_a_404_with_a_filter(charlie, notes, api_client_for):
    response = _list(api_client_for(charlie), subject="dana", metadata={"kind": "note"})
    body = assert_error(response, 404, "scope")
    assert "Dana" not in response.content.decode() and "does not exist" in body["message"]


@pytest.mark.parametrize(("params", "field"), [
    ({"metadata": "not json"}, "metadata"),
    ({"metadata": "[1, 2]"}, "metadata"),
    ({"metadata": json.dumps({f"k{i}": i for i in range(21)})}, "metadata"),
    ({"metadata": "[" * 100_000}, "metadata"),
    ({"since": "yesterday"}, "since"),
    ({"until": "2026-13-01"}, "until"),
    ({"since": "2026-06-02T00:00:00Z", "until": "2026-06-01T00:00:00Z"}, "until"),
    ({"subject": "x" * 1000}, "subject"),
    ({"subject": "da\x00na"}, "subject"),
    ({"subjcet": "dana"}, "subjcet"),
    ({"as_of": "ten"}, "as_of"),
    ({"limit": "0"}, "limit"),
])
def test_a_bad_filter_is_a_400_naming_the_field(alice, notes, api_client_for, params, field):
    assert_error(api_client_for(alice).get(URL, params), 400, field)


def test_a_metadata_filter_over_more_memories_than_it_may_open_asks_to_narrow_the_others(
    alice, notes, api_client_for, monkeypatch
):
    # every page of a metadata listing opens each memory the other filters keep: a bound on what one request opens
    from memories.selectors import log

    monkeypatch.setattr(log, "MAX_METADATA_FILTER_SCAN", 3)
    client = api_client_for(alice)
    refused = _list(client, metadata={"kind": "note"})
    assert refused.status_code == 400 and refused.json()["extra"]["field"] == "metadata"
    assert "narrow" in refused.json()["message"]
    narrowed = _list(client, metadata={"kind": "note"}, subject="dana")  # dana's memories: within the bound
    assert narrowed.status_code == 200 and narrowed.json()["count"] == 2
