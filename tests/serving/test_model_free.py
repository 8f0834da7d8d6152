"""MNESIO_WEB_LOADS_MODEL=false: a web process (uvicorn subprocess) that never imports torch; a real Celery
worker on the gpu queue answers its synchronous, streamed, async and OpenAI asks (sealed, over Redis)."""
from __future__ import annotations

import http.client
import json
import os
import time

import openai
import pytest
from django.conf import settings as django_settings

from cartridges.channels import answer_channel_prefix
from cartridges.models import AnswerRecord, AnswerRequest
from tests.support.procs import database_url
from tests.support.servers import EventStream, token_for

from .webproc import WebProcess

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)"),
]

KEY = "The spare key is under the blue flowerpot beside the green door."


@pytest.fixture
def model_free_web(tmp_path, blob_root):
    """A model-free web process on the test database (stopped at teardown)."""
    env = {
        "DATABASE_URL": database_url(),
        "REDIS_URL": os.environ["REDIS_URL"],
        "MNESIO_WEB_LOADS_MODEL": "false",
        "MNESIO_KV_BACKEND": "transformers",  # the configured default: it still must not load
        "MNESIO_BLOB_ROOT": str(blob_root),
        "MNESIO_DATA_DIR": str(django_settings.DATA_DIR),
        "MNESIO_REMOTE_ANSWER_TIMEOUT_S": "60",
        "SECURE_SSL_REDIRECT": "false",  # plain http on 127.0.0.1 (a proxy terminates TLS in production)
    }
    web = WebProcess(env=env, workdir=tmp_path)
    yield web
    web.stop()


def test_a_model_free_web_process_serves_every_kind_of_ask_without_torch(
    alice, scope_a, served, fake_row, start_worker, model_free_web  # noqa: F811
):
    version = served(scope_a, [KEY, "Ada drinks green tea every morning."])
    worker = start_worker()
    auth = f"Token {token_for(alice)}"
    url = model_free_web.url
    question = {"question": "Where is the spare key?"}

    sync = EventStream(url, "/api/v1/scopes/scope-a/ask/", question, auth=auth)
    assert sync.status == 200, (sync.body(), worker.output()[-2000:], model_free_web.output()[-2000:])
    body = json.loads(sync.body())
    assert body["answer"] == KEY and body["version_id"] == version.pk

    import redis

    spy = redis.Redis.from_url(os.environ["REDIS_URL"]).pubsub()
    spy.psubscribe(answer_channel_prefix() + "*")  # what travels through Redis for a streamed ask
    stream = EventStream(url, "/api/v1/scopes/scope-a/ask/", {**question, "stream": True}, auth=auth)
    events = list(stream.events())
    seen = []
    while (message := spy.get_message(timeout=1)) is not None:
        seen.append(message["data"] if isinstance(message["data"], bytes) else b"")
    spy.close()
    assert sum(b'"seq"' in m for m in seen) == len(KEY.split()) and any(b'"done"' in m for m in seen)
    assert not any(word.encode() in m for m in seen for word in ("spare", "flowerpot", "green")), seen
    deltas = [json.loads(data)["text"] for event, data, _ in events if event == "delta"]
    assert len(deltas) == len(KEY.split()) and "".join(deltas).strip() == KEY, events
    assert events[-1][0] == "done" and json.loads(events[-1][1])["version_id"] == version.pk

    filed = EventStream(url, "/api/v1/scopes/scope-a/ask/", {**question, "async": True}, auth=auth)
    assert filed.status == 202
    location = filed.headers["Location"]
    deadline = time.monotonic() + 60
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", model_free_web.port, timeout=30)
        conn.request("GET", location, headers={"Authorization": auth})
        got = conn.getresponse()
        if got.status != 202 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert got.status == 200 and json.loads(got.read())["answer"] == KEY

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=auth.split()[1], max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Where is the spare key?"}]
    whole = client.chat.completions.create(model="scope-a", messages=messages).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="scope-a", messages=messages, stream=True) if c.choices)
    assert whole == streamed == KEY

    assert not model_free_web.maps_torch()
    rss_kb = model_free_web.rss_kb()
    report = model_free_web.stop()
    assert report == {"torch": False, "transformers": False}, model_free_web.output()[-2000:]
    assert AnswerRecord.objects.filter(version=version).count() == 5  # recorded by the worker, once each
    assert not AnswerRequest.objects.exists()  # every request collected (deleted with its key)
    print(f"model-free web process RSS after serving: {rss_kb} kB")
