"""bin/fleet: the whole fleet from one command, exercised across its processes with the real model.

bin/fleet --own-redis --local-s3 starts Redis (append-only file), moto's S3 server (with the bucket), bin/serve,
the default and gpu workers and beat, against pytest-django's test database. Everything then goes over real
HTTP to the web server: append -> compile (gpu worker, the real SmolLM2) -> gate (gpu) -> activate (default
worker) -> ask (web) -> erase (gpu); the bucket is listed directly to check that every blob of the erased
versions is gone. Teardown kills everything, even after a failure: SIGTERM to honcho (it stops each process
group), then SIGKILL to the fleet's process group and to any process that still carries this run's tag in its
environment (honcho starts each process in its own session, so a process group alone is not enough).

The gate is kept small (one auto probe, short answers) and the scope has three memories, so compile + gate take
seconds once the model is loaded; the model loads in the gpu worker and again in the web worker on its first
answer (from the converted copy in MNESIO_MODEL_CACHE_DIR).
"""
from __future__ import annotations

import shutil

import pytest
import requests

from cartridges.models import CartridgeVersion
from tests.support.procs import FleetRun, fleet_stop, wait_for

pytestmark = [
    pytest.mark.fleet,
    pytest.mark.model,
    pytest.mark.postgres,
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH"),
]

LIFECYCLE_TIMEOUT_S = 420  # model load (20-40 s, more on a busy 2-core machine) + compile + gate, twice
MEMORIES = [
    ("The spare key is under the blue flowerpot.", None),
    ("Dana's locker code is 4417.", "dana"),
    ("The car is parked on level 3.", None),
]


# the real default model, on CPU, with a small gate so compile + gate take seconds once it is loaded
REAL_MODEL = {
    "MNESIO_KV_BACKEND": "transformers",
    "MNESIO_KV_MODEL": "smollm2-135m-instruct",
    "MNESIO_KV_DTYPE": "f32",
    "MNESIO_KV_QUANT": "none",
    "MNESIO_KV_DEVICE": "cpu",
    "MNESIO_GATE_NUM_AUTO_PROBES": "1",
    "MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS": "2",
    "MNESIO_GATE_MAX_NEW_TOKENS": "4",
    "MNESIO_ANSWER_MAX_NEW_TOKENS": "12",
}


@pytest.fixture
def fleet(tmp_path):
    """bin/fleet --own-redis --local-s3 with the real model; always torn down, leaving no process."""
    run = FleetRun(tmp_path, extra_env=REAL_MODEL)
    try:
        yield run
    finally:
        left = fleet_stop(run.proc, run.tag)
        assert left == [], f"processes left running after teardown: {left}"


def _results(body):
    return body["results"] if isinstance(body, dict) and "results" in body else body


def test_the_fleet_runs_append_compile_activate_ask_erase_across_its_processes(fleet, alice, scope_a):
    import boto3
    import redis
    from knox.models import AuthToken

    proc, base, bucket = fleet.proc, fleet.base_url, fleet.bucket
    _, token = AuthToken.objects.create(user=alice)
    http = requests.Session()
    http.headers["Authorization"] = f"Token {token}"
    scope_url = f"{base}/api/v1/scopes/scope-a"

    def log() -> str:
        return proc.output()

    def up(check):
        """A wait_for predicate that fails at once when the fleet has stopped (honcho stops all if one dies)."""
        def predicate():
            assert proc.alive(), f"the fleet stopped:\n{log()[-6000:]}"
            return check()
        return predicate

    wait_for(up(lambda: http.get(f"{base}/api/v1/scopes/", timeout=5).status_code == 200), timeout=180,
             what="the fleet's web server", log=log)
    s3 = boto3.client("s3", endpoint_url=fleet.s3_endpoint, region_name="us-east-1",
                      aws_access_key_id="local", aws_secret_access_key="local")
    wait_for(lambda: s3.head_bucket(Bucket=bucket), timeout=60, what="the local S3 bucket", log=log)
    # the broker persists every write (an append-only file): a Redis restart loses no queued task
    assert redis.Redis(port=fleet.redis_port).config_get("appendonly") == {"appendonly": "yes"}

    for content, subject in MEMORIES:
        response = http.post(f"{scope_url}/memories/", json={"content": content, **({"subject": subject} if subject else {})}, timeout=30)
        assert response.status_code == 201, response.text

    response = http.post(f"{scope_url}/cartridges/compile/", json={"activate": True}, timeout=30)
    assert response.status_code == 202, response.text

    def active() -> dict | None:
        versions = _results(http.get(f"{scope_url}/cartridges/", timeout=10).json())
        return next((v for v in versions if v["state"] == "active"), None)

    first = wait_for(up(active), timeout=LIFECYCLE_TIMEOUT_S, what="compile (gpu) -> gate (gpu) -> activate (default)", log=log)
    assert first["key"]["backend"] == "transformers" and first["key"]["model_id"] == "smollm2-135m-instruct"
    erased = CartridgeVersion.objects.get(pk=first["id"])
    assert [obj["Key"] for obj in s3.list_objects_v2(Bucket=bucket).get("Contents", [])] == [erased.storage_name]

    answer = http.post(f"{scope_url}/ask/", json={"question": "What is Dana's locker code?"}, timeout=LIFECYCLE_TIMEOUT_S)
    assert answer.status_code == 200, (answer.text, log()[-4000:])
    assert answer.json()["version_id"] == first["id"] and answer.json()["answer"].strip()

    response = http.post(f"{scope_url}/erasure-requests/", json={"subject": "dana", "reason": "asked to be forgotten"}, timeout=30)
    assert response.status_code == 201, response.text
    request_url = f"{scope_url}/erasure-requests/{response.json()['id']}/"

    def erased_and_rebuilt() -> str | None:
        status = http.get(request_url, timeout=10).json()["status"]
        assert status != "failed", (http.get(request_url, timeout=10).json(), log()[-4000:])
        return status if status == "views_rebuilt" else None

    wait_for(up(erased_and_rebuilt), timeout=LIFECYCLE_TIMEOUT_S, what="the erasure (gpu worker)", log=log)
    rebuilt = active()
    assert rebuilt is not None and rebuilt["id"] != first["id"]
    states = {v["id"]: v["state"] for v in _results(http.get(f"{scope_url}/cartridges/", timeout=10).json())}
    assert states[first["id"]] == "destroyed"

    # the bucket: every version that held the erased subject is gone (objects and any object versions);
    # the rebuilt blob is the only one left
    holding = [v for v in CartridgeVersion.objects.filter(scope=scope_a) if any(e[0] == 2 for e in v.manifest["entries"])]
    assert erased in holding and all(states[v.pk] == "destroyed" for v in holding)
    keys = [obj["Key"] for obj in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    versions = s3.list_object_versions(Bucket=bucket)
    stored = {e["Key"] for e in [*versions.get("Versions", []), *versions.get("DeleteMarkers", [])]}
    assert not {v.storage_name for v in holding} & (set(keys) | stored)
    assert keys == [CartridgeVersion.objects.get(pk=rebuilt["id"]).storage_name]

    again = http.post(f"{scope_url}/ask/", json={"question": "What is Dana's locker code?"}, timeout=LIFECYCLE_TIMEOUT_S)
    assert again.status_code == 200 and again.json()["version_id"] == rebuilt["id"]
    output = log()
    # the web process had the erased cartridge in memory (the first ask); it dropped it on its next request
    dropped = f"dropped 1 destroyed cartridge(s) [{first['id']}] and "
    assert any(" web.1 " in line and dropped in line for line in output.splitlines())
    for name in ("web.1", "default.1", "gpu.1", "beat.1", "redis.1", "s3.1"):
        assert f"{name} " in output or f"{name}|" in output, f"honcho never started {name}"
    assert "locker code" not in output and "flowerpot" not in output  # no memory text in any process's log
