"""POST /api/v1/scopes/<scope>/ask/ with "stream": true: text/event-stream, an event per delta and a final event,
over real HTTP servers (WSGI: pytest-django's live_server; ASGI: uvicorn) and a real client reading as it comes."""
from __future__ import annotations

import json
import time

import pytest

from cartridges.models import AnswerRecord
from cartridges.services.admission import answers_in_flight
from tests.support.servers import LONG, EventStream, token_for

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "The spare key is under the blue flowerpot."
TEA = "Ada drinks green tea every morning."


def test_it_streams_a_delta_per_word_then_the_version_and_timings(alice, scope_a, served, server_url):
    version = served(scope_a, [KEY, TEA])
    stream = EventStream(server_url, "/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?", "stream": True},
                         auth=f"Token {token_for(alice)}")
    assert stream.status == 200 and stream.headers["Content-Type"].startswith("text/event-stream")
    events = list(stream.events())
    deltas = [json.loads(data)["text"] for event, data, _ in events if event == "delta"]
    assert len(deltas) == len(KEY.split()) and "".join(deltas).strip() == KEY
    (final_event, final, _), = [e for e in events if e[0] != "delta"]
    done = json.loads(final)
    assert final_event == "done" and events[-1][0] == "done"
    assert done["answer"] == KEY and done["version_id"] == version.pk and done["total_s"] >= done["ttft_s"] >= 0
    assert AnswerRecord.objects.get().version_id == version.pk
    assert answers_in_flight() == 0


def test_the_first_delta_arrives_before_the_answer_is_finished(alice, scope_a, served, server_url, slow_engine):
    # each delta takes 0.05 s to decode: an un-streamed (buffered) response would deliver all of them together
    slow_engine.delay_s = 0.05
    served(scope_a, [LONG])
    stream = EventStream(server_url, "/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?", "stream": True},
                         auth=f"Token {token_for(alice)}")
    arrivals = [(event, at) for event, _, at in stream.events()]
    deltas = [at for event, at in arrivals if event == "delta"]
    assert len(deltas) == len(LONG.split())
    assert arrivals[-1][1] - deltas[0] >= 0.05 * (len(deltas) - 2), arrivals  # spread over the decode, not at the end


def test_a_client_that_goes_away_closes_the_engine_stream(alice, scope_a, served, server_url, slow_engine):
    served(scope_a, [LONG])
    stream = EventStream(server_url, "/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?", "stream": True},
                         auth=f"Token {token_for(alice)}")
    event, _, _ = next(stream.events())
    assert event == "delta"
    stream.close()
    assert slow_engine.closed_early.wait(10), "the engine generator was not closed after the client left"
    assert not slow_engine.finished.is_set()
    deadline = time.monotonic() + 5
    while answers_in_flight() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert answers_in_flight() == 0  # the ask's slot was given back
    assert not AnswerRecord.objects.exists()  # nothing answered, nothing recorded


def test_refusals_before_the_first_token_keep_their_status(alice, charlie, scope_a, append, served, server_url):
    # no memories yet: no cartridge to answer from
    stream = EventStream(server_url, "/api/v1/scopes/scope-a/ask/", {"question": "What does Ada drink?", "stream": True},
                         auth=f"Token {token_for(alice)}")
    assert stream.status == 409 and json.loads(stream.body())["extra"]["field"] == "scope"
    stream = EventStream(server_url, "/api/v1/scopes/scope-a/ask/", {"question": "What?", "stream": "yes please"},
                         auth=f"Token {token_for(alice)}")
    assert stream.status == 400 and "stream" in json.loads(stream.body())["message"]
    stream = EventStream(server_url, "/api/v1/scopes/scope-a/ask/", {"question": "What?", "stream": True},
                         auth=f"Token {token_for(charlie)}")
    assert stream.status in (403, 404)


def test_a_client_that_accepts_only_event_streams_gets_its_answer_and_its_refusals_as_events(
    alice, scope_a, served, server_url
):
    # EventSource and most SSE libraries send exactly this Accept header (it was a 406 not_acceptable)
    served(scope_a, [KEY])
    path, auth = "/api/v1/scopes/scope-a/ask/", f"Bearer {token_for(alice)}"
    stream = EventStream(server_url, path, {"question": "Where is the spare key?", "stream": True}, auth=auth,
                         accept="text/event-stream")
    assert stream.status == 200 and stream.headers["Content-Type"].startswith("text/event-stream")
    events = list(stream.events())
    assert "".join(json.loads(data)["text"] for event, data, _ in events if event == "delta").strip() == KEY
    assert events[-1][0] == "done" and json.loads(events[-1][1])["answer"] == KEY
    stream = EventStream(server_url, path, {"question": "What?", "stream": "yes please"}, auth=auth, accept="text/event-stream")
    assert stream.status == 400 and stream.headers["Content-Type"].startswith("text/event-stream")
    (event, data, _), = list(stream.events())
    error = json.loads(data)
    assert event == "error" and error["code"] == "invalid_input" and error["extra"]["status"] == 400
    assert "stream" in error["extra"]["fields"]


def test_an_engine_failure_mid_stream_is_an_error_event(alice, scope_a, served, server_url, slow_engine):
    served(scope_a, [LONG])
    original = slow_engine.answer_stream

    def failing(cartridge, question, *, max_new_tokens=32):
        from kvengine.errors import OverloadedError

        items = original(cartridge, question, max_new_tokens=max_new_tokens)
        yield next(items)
        items.close()
        raise OverloadedError(waiting=9, limit=8, retry_after_s=3)

    slow_engine.answer_stream = failing
    stream = EventStream(server_url, "/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?", "stream": True},
                         auth=f"Token {token_for(alice)}")
    events = list(stream.events())
    assert [e[0] for e in events] == ["delta", "error"]
    error = json.loads(events[-1][1])
    assert error["extra"]["kind"] == "overloaded" and error["extra"]["status"] == 429
    assert error["extra"]["retry_after_s"] == 3
    assert answers_in_flight() == 0


def test_a_worker_stops_decoding_when_nobody_listens_to_its_stream(alice, scope_a, served, slow_engine):
    """The worker side of a model-free stream: a publish that reaches nobody closes the engine generator."""
    from cartridges.services import answer_request_answer, answer_request_file

    served(scope_a, [LONG])
    request = answer_request_file(scope=scope_a, question="Where is the spare key?", actor=alice)
    published: list[int] = []

    def publish(seq: int, sealed: bytes) -> bool:
        published.append(seq)
        assert b"spare" not in sealed  # sealed with the request's key, never text
        return seq < 2  # the asker leaves after the third delta

    answer_request_answer(answer_request=request, publish=publish)
    assert published == [0, 1, 2]
    assert slow_engine.closed_early.is_set() and not slow_engine.finished.is_set()
    request.refresh_from_db()
    assert request.answered_at is None and not request.sealed_answer  # nothing sealed for nobody
    assert not AnswerRecord.objects.exists()


def _slots_back_within(seconds: float) -> float:
    started = time.monotonic()
    while answers_in_flight() and time.monotonic() - started < 5:
        time.sleep(0.01)
    waited = time.monotonic() - started
    assert answers_in_flight() == 0 and waited <= seconds, f"slots still held {waited:.2f} s after the client left"
    return waited


def test_it_gives_the_slot_back_at_once_when_the_client_leaves_while_the_engine_is_stuck(
        alice, scope_a, served, asgi_server, slow_engine):
    """The engine holds its step (before the first delta); the client leaves; the slot is back within a second,
    and the engine generator is closed once its step returns."""
    served(scope_a, [LONG])
    slow_engine.gate.clear()
    stream = EventStream(asgi_server.url, "/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?",
                                                                       "stream": True}, auth=f"Token {token_for(alice)}")
    assert stream.status == 200 and slow_engine.started.wait(10) and answers_in_flight() == 1
    stream.close()
    _slots_back_within(1.0)
    assert not slow_engine.closed_early.is_set()  # still inside its step: only that thread may close it
    slow_engine.gate.set()
    assert slow_engine.closed_early.wait(10) and not slow_engine.finished.is_set()
    assert not AnswerRecord.objects.exists()


def test_a_reader_that_never_reads_holds_its_slot_only_while_the_answer_decodes(
        alice, scope_a, served, asgi_server, slow_engine):
    slow_engine.delay_s = 0.02
    served(scope_a, [LONG])
    stream = EventStream(asgi_server.url, "/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?",
                                                                       "stream": True}, auth=f"Token {token_for(alice)}")
    assert stream.status == 200 and slow_engine.finished.wait(10)  # decoded while nobody read a byte of it
    _slots_back_within(1.0)
    assert [event for event, _, _ in stream.events()][-1] == "done"  # and the slow reader still gets all of it
    stream.close()
