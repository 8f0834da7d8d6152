"""Search latency: POST /api/v1/scopes/<scope>/search/ on a scope of N memories (default 200), on PostgreSQL.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/mnesio_bench MNESIO_DEBUG=1 \\
      .venv/bin/python bench/search_latency.py --memories 200 --queries 300

What one request costs end to end inside the process: token authentication, the scope, the ranking over the
search index (memories.search_index: one statement, BM25 scored as bm25s scores), opening the returned memories
(AES-GCM, one key unwrap per subject), and JSON rendering; Django's test client calls the WSGI stack without a socket, so
network time is not in the figure. The selector alone (memories.selectors.memories_search) is timed too, to
show where the time goes. Queries mix plain, subject-filtered and time-filtered searches; the first requests
warm the process (imports, the query terms' postings) and are not counted. Writes JSON to --out and prints it.
Target: p95 <= 50 ms on a scope of 200 memories.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PEOPLE = ["dana", "erin", "frank", "gita", "hiro", "ines", "jon", "kemal", "lena", "mo"]
THINGS = ["spare key", "locker code", "car", "passport", "laptop", "umbrella", "bike", "badge", "charger", "notebook"]
PLACES = ["blue flowerpot", "kitchen drawer", "garage level 3", "top shelf", "front desk", "basement", "red bag",
          "glovebox", "meeting room 12", "hall closet"]
VERBS = ["keeps", "left", "stores", "hid", "put", "found"]


def _memories(num: int, rng: random.Random) -> list[tuple[str | None, str]]:
    out = []
    for i in range(num):
        person = rng.choice(PEOPLE)
        text = (f"{person.capitalize()} {rng.choice(VERBS)} the {rng.choice(THINGS)} in the {rng.choice(PLACES)} "
                f"on day {i}; note {rng.randrange(10_000)}.")
        out.append((person if rng.random() < 0.7 else None, text))
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _summary(seconds: list[float]) -> dict:
    return {"p50_ms": round(1000 * statistics.median(seconds), 2), "p95_ms": round(1000 * _percentile(seconds, 0.95), 2),
            "max_ms": round(1000 * max(seconds), 2), "num": len(seconds)}


def run(*, num_memories: int, num_queries: int, top_k: int, seed: int = 7) -> dict:
    """Build a scope of ``num_memories``, then time ``num_queries`` API searches and as many selector calls."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from knox.models import AuthToken
    from rest_framework.test import APIClient

    from memories.models import Memory
    from memories.selectors import memories_search
    from memories.services import memory_append, scope_create, scope_grant

    rng = random.Random(seed)
    scope = scope_create(name=f"search-bench-{uuid.uuid4().hex[:8]}")
    user = get_user_model().objects.create_user(username=f"bench-{uuid.uuid4().hex[:8]}")
    scope_grant(scope=scope, user=user)
    for subject, text in _memories(num_memories, rng):
        memory_append(scope=scope, subject=subject, content=text)
    rows = list(Memory.objects.filter(scope=scope).order_by("seq").values_list("created_at", flat=True))
    since = rows[len(rows) // 2]
    middle = since.isoformat()
    client = APIClient(HTTP_HOST=(settings.ALLOWED_HOSTS or ["localhost"])[0].lstrip(".").replace("*", "localhost"))
    client.credentials(HTTP_AUTHORIZATION=f"Token {AuthToken.objects.create(user=user)[1]}")
    url = f"/api/v1/scopes/{scope.name}/search/"

    def body(i: int) -> dict:
        query = f"{rng.choice(THINGS)} {rng.choice(PLACES)}"
        kind = i % 3
        if kind == 1:
            return {"query": query, "top_k": top_k, "subject": rng.choice(PEOPLE)}
        if kind == 2:
            return {"query": query, "top_k": top_k, "since": middle}
        return {"query": query, "top_k": top_k}

    for i in range(10):  # warm-up: imports, connection, the terms' postings
        assert client.post(url, data=body(i), format="json").status_code == 200
    api, api_cpu, selector, num_hits = [], [], [], []
    for i in range(num_queries):
        data = body(i)
        started, cpu_started = time.perf_counter(), time.process_time()
        response = client.post(url, data=data, format="json")
        api.append(time.perf_counter() - started)
        api_cpu.append(time.process_time() - cpu_started)
        assert response.status_code == 200, response.content[:300]
        num_hits.append(len(response.json()["results"]))
        started = time.perf_counter()
        memories_search(scope=scope, **({**data, "since": since} if "since" in data else data))
        selector.append(time.perf_counter() - started)
    return {
        "scenario": "search latency",
        "num_memories": num_memories,
        "num_queries": num_queries,
        "top_k": top_k,
        "api": _summary(api),
        # this process's CPU time per request (not PostgreSQL's): less sensitive to other processes on the machine
        "api_process_cpu": _summary(api_cpu),
        "selector": _summary(selector),
        "mean_hits": round(statistics.mean(num_hits), 1),
        "target_p95_ms": 50,
        "met": _summary(api)["p95_ms"] <= 50 if num_memories == 200 else None,
        "cpu_count": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=200)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/search_latency.json")
    parser.add_argument("--no-migrate", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
    os.environ.setdefault("MNESIO_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    if not settings.IS_POSTGRES:
        sys.exit("search_latency measures PostgreSQL: set DATABASE_URL=postgres://...")
    if not args.no_migrate:
        call_command("migrate", interactive=False, verbosity=0)
    figures = run(num_memories=args.memories, num_queries=args.queries, top_k=args.top_k)
    figures["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
