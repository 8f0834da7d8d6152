"""Observability (core/observability.py, cartridges/prometheus.py): JSON log lines with a request id that a client may
set and that follows the request into the Celery task it queues (in-process and on a real worker); no memory text in
any log line; request-latency histograms per route and the gpu queue's depth in the Prometheus output."""
from __future__ import annotations

import io
import json
import logging
import os
import re

import pytest

from core.observability import JsonFormatter
from tests.support.worker import wait_for_worker

MARKER = "zebra-quartz-7731"  # a memory text no log line may ever hold
LOGGERS = ("", "mnesio", "memories", "cartridges", "kvengine", "django", "django.request", "celery")


@pytest.fixture
def json_log():
    """Every record of the project's, Django's, Celery's and the root logger, rendered by the JSON formatter, at DEBUG."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    before = {}
    for name in LOGGERS:
        logger = logging.getLogger(name)
        before[name] = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    yield stream
    for name in LOGGERS:
        logging.getLogger(name).removeHandler(handler)
        logging.getLogger(name).setLevel(before[name])


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


@pytest.mark.django_db
def test_a_well_formed_request_id_is_kept_and_anything_else_replaced(alice, api_client_for):
    client = api_client_for(alice)
    assert client.get("/api/v1/scopes/", HTTP_X_REQUEST_ID="lb-7f3a.42:x")["X-Request-ID"] == "lb-7f3a.42:x"
    for hostile in ("two words", 'quote"d', "x" * 129, "line\nbreak", "", "é"):
        returned = client.get("/api/v1/scopes/", HTTP_X_REQUEST_ID=hostile)["X-Request-ID"]
        assert re.fullmatch(r"[0-9a-f]{32}", returned), (hostile, returned)
    first, second = client.get("/api/v1/scopes/")["X-Request-ID"], client.get("/api/v1/scopes/")["X-Request-ID"]
    assert first != second and re.fullmatch(r"[0-9a-f]{32}", first)
    # an error answer carries it too
    assert client.get("/api/v1/scopes/nope/head/", HTTP_X_REQUEST_ID="err-1")["X-Request-ID"] == "err-1"


@pytest.mark.django_db
def test_log_lines_are_json_and_carry_the_request_id_into_an_in_process_task(
    alice, scope_a, api_client_for, json_log, fake_row, eager_tasks
):
    client = api_client_for(alice)
    client.post("/api/v1/scopes/scope-a/memories/", {"content": "The bike is in the shed."}, format="json",
                HTTP_X_REQUEST_ID="req-append-1")
    response = client.post("/api/v1/scopes/scope-a/cartridges/compile/", {}, format="json", HTTP_X_REQUEST_ID="req-compile-1")
    assert response.status_code == 202, response.content
    lines = _lines(json_log)
    appended = [line for line in lines if line["event"].startswith("memories appended")]
    assert appended and appended[0]["request_id"] == "req-append-1" and appended[0]["logger"] == "memories"
    assert {"timestamp", "level", "logger", "event"} <= set(appended[0])
    compiled = [line for line in lines if line["event"].startswith("cartridge compiled")]
    assert compiled and compiled[0]["request_id"] == "req-compile-1", compiled
    assert compiled[0]["task"] == "cartridges.tasks.cartridge_compile_task" and compiled[0]["task_id"]
    # nothing stays bound once the request is over
    logging.getLogger("mnesio").info("after the request")
    assert "request_id" not in _lines(json_log)[-1] and "task_id" not in _lines(json_log)[-1]


@pytest.mark.django_db
def test_no_log_line_holds_memory_text_through_append_ask_compile_and_erase(
    alice, scope_a, api_client_for, json_log, fake_row, eager_tasks, capfd, django_capture_on_commit_callbacks
):
    client = api_client_for(alice)
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post("/api/v1/scopes/scope-a/memories/", {"content": f"The vault code is {MARKER}.",
                                                             "subject": "vera"}, format="json").status_code == 201
        client.post("/api/v1/scopes/scope-a/memories/", {"content": f"Also {MARKER} opens the gate."}, format="json")
        text = client.post("/api/v1/scopes/scope-a/ask/", {"question": f"What is {MARKER}?", "mode": "text"},
                           format="json")
        assert MARKER in text.content.decode()  # the fake engine answers with the memory texts: they went through
        compile_ = client.post("/api/v1/scopes/scope-a/cartridges/compile/", {"activate": True}, format="json")
        assert compile_.status_code == 202, compile_.content
    with django_capture_on_commit_callbacks(execute=True):  # the activation ran after the compile committed
        asked = client.post("/api/v1/scopes/scope-a/ask/", {"question": "What is the vault code?"}, format="json")
        assert asked.status_code == 200 and MARKER in asked.content.decode(), asked.content
        client.post("/api/v1/scopes/scope-a/memories/", {"content": "", "subject": MARKER}, format="json")  # a 400
        erase = client.post("/api/v1/scopes/scope-a/erasure-requests/", {"subject": "vera", "reason": "asked"},
                            format="json")
        assert erase.status_code == 201, erase.content
    logged = json_log.getvalue()
    assert len(_lines(json_log)) >= 8, logged  # the scan saw the requests' lines
    assert MARKER not in logged
    captured = capfd.readouterr()
    assert MARKER not in captured.out and MARKER not in captured.err


def _scrape(client) -> str:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    return response.content.decode()


def _sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.django_db
def test_prometheus_has_request_latency_per_route_and_the_gpu_queue_at_zero_in_process(
    alice, operator, scope_a, api_client_for, fake_row, eager_tasks
):
    client = api_client_for(alice)
    before = _sample(_scrape(api_client_for(operator)), "mnesio_http_request_duration_seconds_count",
                     route="scope-memories", method="POST", status="2xx") or 0
    for i in range(3):
        client.post("/api/v1/scopes/scope-a/memories/", {"content": f"Fact {i}."}, format="json")
    client.post("/api/v1/scopes/scope-a/memories/", {"content": ""}, format="json")  # a 4xx
    text = _scrape(api_client_for(operator))
    assert "# TYPE mnesio_http_request_duration_seconds histogram" in text
    assert _sample(text, "mnesio_http_request_duration_seconds_count", route="scope-memories", method="POST",
                   status="2xx") == before + 3
    assert _sample(text, "mnesio_http_request_duration_seconds_count", route="scope-memories", method="POST",
                   status="4xx") >= 1
    assert _sample(text, "mnesio_http_request_duration_seconds_bucket", route="scope-memories", method="POST",
                   status="2xx", le="+Inf") == before + 3
    assert "scope-a" not in re.findall(r"mnesio_http_request_duration_seconds_count\{[^}]*\}", text)[0]  # no paths
    assert _sample(text, "mnesio_queue_depth", queue="gpu") == 0
    assert _sample(text, "mnesio_queue_depth", queue="default") == 0
    # a client's scrape holds neither (they count every scope's traffic)
    own = _scrape(client)
    assert "mnesio_http_request_duration_seconds" not in own and "mnesio_queue_depth" not in own


@pytest.mark.postgres
@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)")
@pytest.mark.django_db(transaction=True)
def test_the_gpu_queue_depth_counts_waiting_model_work_and_the_request_id_reaches_a_real_worker(
    alice, operator, scope_a, api_client_for, fake_row, real_broker, redis_clean, start_worker
):
    from cartridges.models import CartridgeVersion
    from memories.services import memory_append

    memory_append(scope=scope_a, content="The bike is in the shed.")
    client = api_client_for(alice)
    queued = client.post("/api/v1/scopes/scope-a/cartridges/compile/", {}, format="json",
                         HTTP_X_REQUEST_ID="req-worker-42")
    assert queued.status_code == 202 and queued.json()["status"] == "queued", queued.content
    assert queued["X-Request-ID"] == "req-worker-42"
    text = _scrape(api_client_for(operator))
    assert _sample(text, "mnesio_queue_depth", queue="gpu") == 1  # no worker yet: the compile waits
    assert redis_clean.llen("gpu") == 1

    worker = start_worker()
    wait_for_worker(lambda: CartridgeVersion.objects.filter(scope=scope_a).exists(), timeout=120, what="the compile",
          worker=worker)
    wait_for_worker(lambda: "cartridge compiled" in worker.output(), timeout=30, what="the compile's log line", worker=worker)
    compiled = [json.loads(line) for line in worker.output().splitlines()
                if line.startswith("{") and "cartridge compiled" in line]
    assert compiled, worker.output()[-3000:]
    assert compiled[0]["request_id"] == "req-worker-42", compiled
    assert compiled[0]["task"] == "cartridges.tasks.cartridge_compile_task" and compiled[0]["task_id"]
    wait_for_worker(lambda: redis_clean.llen("gpu") == 0, timeout=30, what="the queue to drain", worker=worker)
    assert _sample(_scrape(api_client_for(operator)), "mnesio_queue_depth", queue="gpu") == 0
    assert "The bike is in the shed" not in worker.output()


@pytest.mark.urls("tests.reliability.streaming_urls")
def test_a_streamed_body_logs_with_the_request_id_while_it_is_produced(client, json_log):
    response = client.get("/stream/", HTTP_X_REQUEST_ID="req-stream-9")
    assert response["X-Request-ID"] == "req-stream-9"
    body = b"".join(response.streaming_content).decode()
    assert body.count("data:") == 3
    streamed = [line for line in _lines(json_log) if line["event"].startswith("streamed chunk")]
    assert len(streamed) == 3 and all(line.get("request_id") == "req-stream-9" for line in streamed), streamed
    logging.getLogger("mnesio").info("after the stream")
    assert "request_id" not in _lines(json_log)[-1]
