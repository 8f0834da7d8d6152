"""The Python client (clients/python, mnesio_client) against a live uvicorn server with the fake engine: every call
of its surface, errors raised with the API's stable codes, and another tenant's scope not found."""
from __future__ import annotations

import time

import httpx
import pytest
from mnesio_client import MnesioClient, MnesioError

from tests.support.servers import LONG, token_for

pytestmark = pytest.mark.django_db(transaction=True)

FACTS = ["Lena's dog is called Pixel.", "The spare key is under the blue flowerpot."]


@pytest.fixture
def client_for(asgi_server):
    """Factory: user -> a MnesioClient of the live server with a new token of the user (closed at teardown)."""
    made: list[MnesioClient] = []

    def make(user, **kwargs) -> MnesioClient:
        client = MnesioClient(asgi_server.url, token_for(user), **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def test_it_appends_lists_and_gets_memories(alice, scope_a, client_for):
    client = client_for(alice)
    first = client.append("scope-a", FACTS[0], subject="lena", metadata={"source": "chat"})
    again = client.append("scope-a", FACTS[1], idempotency_key="k-1")
    repeated = client.append("scope-a", FACTS[1], idempotency_key="k-1")
    assert (first.content, first.subject, first.metadata, first.erased) == (FACTS[0], "lena", {"source": "chat"}, False)
    assert repeated == again  # the original row, not a second one
    page = client.list_memories("scope-a", limit=1)
    assert (page.count, page.as_of, [m.content for m in page.results]) == (2, again.seq, [FACTS[0]])
    assert page.next is not None
    assert [m.seq for m in client.iter_memories("scope-a", page_size=1)] == [first.seq, again.seq]
    assert client.get_memory("scope-a", first.seq) == first
    assert [s.name for s in client.scopes()] == ["scope-a"]


def test_it_appends_a_batch_all_or_nothing(alice, scope_a, client_for):
    client = client_for(alice)
    result = client.append_batch("scope-a", [{"content": FACTS[0], "idempotency_key": "a"}, {"content": FACTS[1]}])
    assert (result.num_created, result.num_existing) == (2, 0)
    assert [(i.index, i.status, i.memory.content) for i in result.items] == [(0, "created", FACTS[0]),
                                                                             (1, "created", FACTS[1])]
    with pytest.raises(MnesioError) as refused:
        client.append_batch("scope-a", [{"content": "Otto plays the oboe."}, {"content": "   "}])
    assert refused.value.status_code == 400 and refused.value.code == "invalid_input"
    assert [e["field"] for e in refused.value.extra["errors"]] == ["items[1].content"]
    assert client.list_memories("scope-a").count == 2  # nothing of the refused batch was written


def test_it_searches_best_match_first(alice, scope_a, client_for):
    client = client_for(alice)
    client.append_batch("scope-a", [{"content": FACTS[0], "subject": "lena"}, {"content": FACTS[1]}])
    found = client.search("scope-a", "spare key flowerpot", top_k=5)
    assert found.scope == "scope-a" and found.results[0].content == FACTS[1] and found.results[0].score > 0
    assert [h.content for h in client.search("scope-a", "dog", subject="lena").results] == [FACTS[0]]


def test_it_forgets_a_memory_with_a_202_and_reads_it_erased(alice, scope_a, served, asgi_server):
    served(scope_a, FACTS)
    statuses: list[int] = []
    http = httpx.Client(event_hooks={"response": [lambda response: statuses.append(response.status_code)]})
    with http, MnesioClient(asgi_server.url, token_for(alice), http_client=http) as client:
        request = client.forget("scope-a", 1, reason="asked to")
        assert statuses == [202]
        assert (request.kind, request.seq, request.reason) == ("memory", 1, "asked to")
        memory = client.get_memory("scope-a", 1)
        assert memory.erased and memory.content is None
        assert [h.seq for h in client.search("scope-a", "Pixel dog").results] == []


def test_it_asks_and_streams_deltas_that_join_into_the_answer(alice, scope_a, served, client_for):
    version = served(scope_a, FACTS)
    client = client_for(alice)
    answer = client.ask("scope-a", "What is Lena's dog called?")
    assert answer.answer == FACTS[0]  # the fake engine answers with the best memory
    assert (answer.mode, answer.version_id) == ("cartridge", version.pk)
    with client.ask_stream("scope-a", "What is Lena's dog called?") as stream:
        deltas = list(stream)
    assert len(deltas) > 1 and "".join(deltas) == answer.answer == stream.text
    assert stream.answer is not None and stream.answer.answer == answer.answer
    assert client.ask_stream("scope-a", "Where is the spare key?", mode="text").result().answer == FACTS[1]
    turns = [("user", "My locker code is 4417."), ("assistant", "Noted.")]
    assert client.ask("scope-a", "What is Lena's dog called?", system="Be brief.", history=turns).answer


def test_it_creates_lists_and_revokes_own_tokens(alice, scope_a, client_for, asgi_server):
    client = client_for(alice)
    made = client.create_token(name="ci", scopes=["scope-a"])
    assert made.token and (made.name, made.scopes) == ("ci", ["scope-a"])
    assert made.id in [t.id for t in client.list_tokens()]
    with MnesioClient(asgi_server.url, made.token) as limited:
        assert limited.append("scope-a", FACTS[0]).content == FACTS[0]
        client.revoke_token(made.id)
        assert made.id not in [t.id for t in client.list_tokens()]
        with pytest.raises(MnesioError) as revoked:
            limited.list_memories("scope-a")
    assert (revoked.value.status_code, revoked.value.code) == (401, "authentication_failed")


def test_it_raises_the_stable_code_naming_the_bad_field(alice, scope_a, client_for):
    client = client_for(alice)
    with pytest.raises(MnesioError) as bad:
        client.search("scope-a", "dog", top_k=1000)
    assert (bad.value.status_code, bad.value.code) == (400, "invalid_input")
    assert "top_k" in bad.value.extra["fields"] and "top_k" in bad.value.message
    with pytest.raises(MnesioError) as blank:
        client.ask_stream("scope-a", "   ")  # refused before the stream starts
    assert blank.value.code == "invalid_input" and "question" in blank.value.extra["fields"]


def test_it_answers_another_tenants_scope_not_found(alice, charlie, scope_a, served, client_for):
    served(scope_a, FACTS)
    client = client_for(charlie)
    calls = [
        lambda: client.list_memories("scope-a"), lambda: client.get_memory("scope-a", 1),
        lambda: client.append("scope-a", "Charlie was here."), lambda: client.search("scope-a", "dog"),
        lambda: client.forget("scope-a", 1), lambda: client.ask("scope-a", "What is Lena's dog called?"),
        lambda: client.ask_stream("scope-a", "What is Lena's dog called?"),
    ]
    for call in calls:
        with pytest.raises(MnesioError) as missing:
            call()
        assert (missing.value.status_code, missing.value.code) == (404, "not_found")
    assert client_for(alice).get_memory("scope-a", 1).content == FACTS[0]  # still there, not forgotten


def test_it_yields_each_delta_as_it_is_decoded(alice, scope_a, served, client_for, slow_engine):
    slow_engine.delay_s = 0.05  # per delta: a buffered response would deliver them all at once, at the end
    served(scope_a, [LONG])
    arrivals: list[float] = []
    for _ in client_for(alice).ask_stream("scope-a", "Where is the spare key?"):
        arrivals.append(time.perf_counter())
    assert len(arrivals) == len(LONG.split())
    assert arrivals[-1] - arrivals[0] >= 0.05 * (len(arrivals) - 2), arrivals


def test_it_stops_the_answer_when_the_stream_is_closed_early(alice, scope_a, served, client_for, slow_engine):
    served(scope_a, [LONG])
    with client_for(alice).ask_stream("scope-a", "Where is the spare key?") as stream:
        assert next(iter(stream))
    assert slow_engine.closed_early.wait(10), "the engine kept decoding after the client closed its stream"
    assert not slow_engine.finished.is_set()


def test_it_raises_an_error_event_mid_stream_with_its_code(alice, scope_a, served, client_for, slow_engine):
    from kvengine.errors import OverloadedError

    served(scope_a, [LONG])
    original = slow_engine.answer_stream

    def failing(cartridge, question, *, max_new_tokens=32):
        items = original(cartridge, question, max_new_tokens=max_new_tokens)
        yield next(items)
        items.close()
        raise OverloadedError(waiting=9, limit=8, retry_after_s=3)

    slow_engine.answer_stream = failing
    stream = client_for(alice).ask_stream("scope-a", "Where is the spare key?")
    deltas: list[str] = []
    with pytest.raises(MnesioError) as failed:
        for delta in stream:
            deltas.append(delta)
    assert len(deltas) == 1 and stream.answer is None
    assert (failed.value.code, failed.value.status_code, failed.value.extra["retry_after_s"]) == ("overloaded", 429, 3)


def test_it_raises_a_response_that_is_not_the_error_shape_with_its_status():
    def proxy(request: httpx.Request) -> httpx.Response:  # a proxy in front of the server, say
        return httpx.Response(503, text="<html>upstream down</html>", headers={"Retry-After": "7"})

    with MnesioClient("http://mnesio.test", "t", transport=httpx.MockTransport(proxy)) as client:
        with pytest.raises(MnesioError) as failed:
            client.get_memory("scope-a", 1)
    assert (failed.value.code, failed.value.status_code, failed.value.retry_after_s) == ("error", 503, 7.0)
    assert "upstream down" in failed.value.message
