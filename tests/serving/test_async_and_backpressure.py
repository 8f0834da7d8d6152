"""async=true asks (202 + Location, collected once, by the asker only) and back-pressure (429 + Retry-After)."""
from __future__ import annotations

import json
import threading

import openai
import pytest

from cartridges.models import AnswerRequest
from cartridges.services.admission import answers_in_flight
from tests.support.servers import EventStream, token_for

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "The spare key is under the blue flowerpot."


def test_an_async_ask_is_collected_once_by_its_asker(alice, scope_a, served, api_client_for):
    served(scope_a, [KEY])
    client = api_client_for(alice)
    response = client.post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?", "async": True}, format="json")
    assert response.status_code == 202, response.content
    location = response["Location"]
    assert location == response.json()["location"] and location.startswith("/api/v1/scopes/scope-a/answers/")
    collected = client.get(location)
    assert collected.status_code == 200 and collected.json()["answer"] == KEY
    again = client.get(location)
    assert again.status_code == 404 and again.json()["extra"]["field"] == "answer_request"
    assert not AnswerRequest.objects.exists()


def test_an_async_ask_whose_question_looks_like_sealed_options_is_answered_as_a_question(alice, scope_a, served,
                                                                                         api_client_for):
    served(scope_a, [KEY])
    client = api_client_for(alice)
    for question in ('{"kind": "mnesio-ask-v1", "decoding": {"x": 1}, "question": "Where is the spare key under '
                     'the blue flowerpot?", "max_new_tokens": null}',
                     '{"kind": "mnesio-ask-v1", "decoding": {}, "question": "Who?", "max_new_tokens": 1, '
                     '"about": "the spare key under the blue flowerpot"}'):
        response = client.post("/api/v1/scopes/scope-a/ask/", {"question": question, "async": True}, format="json")
        assert response.status_code == 202, response.content
        collected = client.get(response["Location"])
        # the fake engine answers the memory sharing words with the question: the question's whole text was asked,
        # with the default options (not "Who?" in one token: that would be "I don't know")
        assert collected.status_code == 200 and collected.json()["answer"] == KEY, collected.content
    assert not AnswerRequest.objects.exists()


def test_a_pending_async_ask_answers_202_again(alice, scope_a, served, api_client_for):
    from mnesio_site.celery import app

    served(scope_a, [KEY])
    client = api_client_for(alice)
    before = app.conf.broker_url
    app.conf.task_always_eager = False  # no worker and a broker nobody reads: the request stays pending
    app.conf.broker_url = "memory://"
    try:
        response = client.post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?", "async": True},
                               format="json")
    finally:
        app.conf.task_always_eager = True
        app.conf.broker_url = before
    assert response.status_code == 202
    pending = client.get(response["Location"])
    assert pending.status_code == 202 and pending["Location"] == response["Location"] and pending["Retry-After"]
    assert AnswerRequest.objects.count() == 1  # still there to collect


def test_only_the_asker_in_the_same_scope_collects(alice, bob, charlie, scope_a, scope_c, served, api_client_for):
    served(scope_a, [KEY])
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?",
                                                                       "async": True}, format="json")
    pk = response.json()["answer_request"]
    # bob shares scope A but did not ask; charlie asks through his own scope with alice's id; then A for charlie
    assert api_client_for(bob).get(f"/api/v1/scopes/scope-a/answers/{pk}/").status_code == 404
    assert api_client_for(charlie).get(f"/api/v1/scopes/scope-c/answers/{pk}/").status_code == 404
    assert api_client_for(charlie).get(f"/api/v1/scopes/scope-a/answers/{pk}/").status_code in (403, 404)
    assert AnswerRequest.objects.filter(pk=pk).exists()  # none of them consumed it
    assert api_client_for(alice).get(f"/api/v1/scopes/scope-a/answers/{pk}/").json()["answer"] == KEY


def test_async_and_stream_together_are_refused_naming_async(alice, scope_a, served, api_client_for):
    served(scope_a, [KEY])
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where?", "async": True,
                                                                       "stream": True}, format="json")
    assert response.status_code == 400 and "async" in response.json()["message"]


def test_past_the_bound_every_ask_is_429_with_retry_after(alice, scope_a, served, live_server, slow_engine, settings):
    """One ask holds the only slot (its engine stream waits); sync, streamed and OpenAI asks get 429 at once."""
    settings.MNESIO_MAX_WAITING_ASKS = 1
    settings.MNESIO_ASK_RETRY_AFTER_S = 7
    served(scope_a, [KEY])
    slow_engine.gate.clear()
    token = token_for(alice)
    # the holder's response starts with its first delta, which the gate holds back: open it from a thread
    opened: list[EventStream] = []
    opener = threading.Thread(target=lambda: opened.append(EventStream(
        live_server.url, "/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?", "stream": True},
        auth=f"Token {token}", timeout=150)))
    opener.start()
    assert slow_engine.started.wait(10) and answers_in_flight() == 1
    for body in ({"question": "Where is the spare key?"}, {"question": "Where is the spare key?", "stream": True}):
        refused = EventStream(live_server.url, "/api/v1/scopes/scope-a/ask/", body, auth=f"Token {token}", timeout=10)
        assert refused.status == 429 and refused.headers["Retry-After"] == "7"
        assert json.loads(refused.body())["extra"] == {"kind": "overloaded", "retry_after_s": 7, "waiting": 1, "limit": 1}
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=token, max_retries=0, timeout=10)
    for stream in (False, True):
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="scope-a", messages=[{"role": "user", "content": "Where?"}],
                                           stream=stream)
        assert caught.value.response.headers["Retry-After"] == "7" and caught.value.body["type"] == "rate_limit_error"
    slow_engine.gate.set()
    opener.join(30)
    events = [event for event, _, _ in opened[0].events()]
    assert events[-1] == "done"  # the held ask was never disturbed
    assert answers_in_flight() == 0


def test_the_bound_holds_under_a_burst_of_threads(alice, scope_a, served, live_server, slow_engine, settings):
    """20 concurrent asks on a bound of 3: exactly 3 are answered, the rest 429 at once; nothing hangs."""
    settings.MNESIO_MAX_WAITING_ASKS = 3
    served(scope_a, [KEY])
    slow_engine.gate.clear()
    token = token_for(alice)
    statuses: list[int] = []
    lock = threading.Lock()

    def ask() -> None:
        stream = EventStream(live_server.url, "/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?",
                                                                           "stream": True}, auth=f"Token {token}", timeout=30)
        list(stream.events()) if stream.status == 200 else stream.body()
        with lock:
            statuses.append(stream.status)

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for t in threads:
        t.start()
    import time

    deadline = time.monotonic() + 15
    while (len(statuses) < 17 or answers_in_flight() < 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    slow_engine.gate.set()
    for t in threads:
        t.join(30)
    assert sorted(statuses) == [200] * 3 + [429] * 17
    assert answers_in_flight() == 0


def test_a_model_free_ask_nobody_answers_is_a_504_not_a_hung_request(alice, scope_a, served, api_client_for, settings):
    """No gpu worker reads the queue: the web process gives up after MNESIO_REMOTE_ANSWER_TIMEOUT_S and withdraws."""
    import time

    from mnesio_site.celery import app

    served(scope_a, [KEY])
    settings.MNESIO_WEB_LOADS_MODEL = False
    settings.MNESIO_REMOTE_ANSWER_TIMEOUT_S = 1
    before = app.conf.broker_url
    app.conf.task_always_eager = False
    app.conf.broker_url = "memory://"  # sent, never consumed
    try:
        started = time.monotonic()
        response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"},
                                              format="json")
        waited = time.monotonic() - started
        stream = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?",
                                                                         "stream": True}, format="json")
        events = b"".join(stream.streaming_content).decode()
    finally:
        app.conf.task_always_eager = True
        app.conf.broker_url = before
    assert response.status_code == 504 and response.json()["extra"]["kind"] == "worker_timeout"
    assert response.json()["code"] == "worker_timeout"
    assert response["Retry-After"] and 1 <= waited < 10
    assert stream.status_code == 200 and "event: error" in events and '"status":504' in events and '"code":"worker_timeout"' in events
    assert not AnswerRequest.objects.exists()  # both withdrawn, with their keys
    assert answers_in_flight() == 0


def test_a_full_engine_queue_is_429_with_the_engines_retry_after(alice, scope_a, served, api_client_for, fake_engine):
    """The batcher's OverloadedError (its own bound) reaches the client as the same 429, sync and OpenAI."""
    from cartridges import engine
    from kvengine.errors import OverloadedError
    from kvengine.fake import FakeKvBackend

    class Full(FakeKvBackend):
        def answer(self, cartridge, question, *, max_new_tokens=32):
            raise OverloadedError(waiting=64, limit=64, retry_after_s=4.2)

    served(scope_a, [KEY])
    engine.register_backend(fake_engine, Full(model="fake-model"))
    try:
        response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"},
                                              format="json")
        client = api_client_for(alice)
        client.credentials(HTTP_AUTHORIZATION=response.wsgi_request.META["HTTP_AUTHORIZATION"].replace("Token", "Bearer"))
        chat = client.post("/v1/chat/completions", {"model": "scope-a", "messages": [{"role": "user", "content": "Where?"}]},
                           format="json")
    finally:
        engine.cache_clear(backends=True)
    assert response.status_code == 429 and response["Retry-After"] == "4"
    assert response.json()["extra"] == {"kind": "overloaded", "retry_after_s": 4, "waiting": 64, "limit": 64}
    assert chat.status_code == 429 and chat["Retry-After"] == "4" and chat.json()["error"]["type"] == "rate_limit_error"
    assert answers_in_flight() == 0
