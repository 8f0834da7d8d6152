"""What the operator endpoints and the observability middleware cost per request, in process (Django's test client).

    .venv/bin/python bench/ops_overhead.py --requests 300 --out bench/results/ops_overhead.json

Measures, on a throwaway SQLite database (or ``DATABASE_URL``) with the fake engine:
- ``GET /healthz`` and ``GET /readyz`` (database, broker: skipped without ``REDIS_URL``, a blob probe, the model);
- ``GET /api/scopes/`` with the whole middleware stack, and without ``core.observability.RequestIdMiddleware``
  (the request id, the JSON log context and the latency histogram), side by side in one run.
Wall-clock p50/p95 in ms; ratios side by side are what to read when the machine is shared.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup(data_dir: str) -> None:
    os.environ.setdefault("MNESIO_DATA_DIR", data_dir)
    os.environ.setdefault("MNESIO_ALLOW_FAKE_BACKEND", "true")
    os.environ.setdefault("MNESIO_KV_BACKEND", "fake")
    os.environ.setdefault("MNESIO_KV_MODEL", "fake-model")
    os.environ.setdefault("MNESIO_DEBUG", "true")
    os.environ.setdefault("SECURE_SSL_REDIRECT", "false")
    os.environ.setdefault("MNESIO_LOG_LEVEL", "WARNING")
    os.environ["DJANGO_SETTINGS_MODULE"] = "mnesio_site.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _time(client, path: str, num: int, **headers: str) -> dict[str, float]:
    samples = []
    for _ in range(num):
        started = time.perf_counter()
        response = client.get(path, **headers)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (path, response.status_code, response.content[:300])
    samples.sort()
    return {"p50_ms": round(statistics.median(samples), 3), "p95_ms": round(samples[int(0.95 * (len(samples) - 1))], 3),
            "num": num}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    _setup(tempfile.mkdtemp(prefix="mnesio-ops-bench-"))

    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import override_settings
    from knox.models import AuthToken

    from memories.services import scope_create, scope_grant

    user = get_user_model().objects.create_user(username="bench", password="x-bench")
    scope_grant(scope=scope_create(name="bench"), user=user)
    token = f"Token {AuthToken.objects.create(user=user)[1]}"
    client = Client()
    client.get("/readyz")  # starts loading the (fake) model
    time.sleep(0.5)
    results = {
        "healthz": _time(client, "/healthz", args.requests),
        "readyz": _time(client, "/readyz", args.requests),
        "api_scopes_with_request_id": _time(client, "/api/scopes/", args.requests, HTTP_AUTHORIZATION=token),
    }
    without = [m for m in settings.MIDDLEWARE if m != "core.observability.RequestIdMiddleware"]
    with override_settings(MIDDLEWARE=without):
        results["api_scopes_without_request_id"] = _time(client, "/api/scopes/", args.requests,
                                                         HTTP_AUTHORIZATION=token)
    results["api_scopes_with_request_id_again"] = _time(client, "/api/scopes/", args.requests,
                                                        HTTP_AUTHORIZATION=token)
    results["database"] = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    print(json.dumps(results, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
