"""Search over the search index at scale: /api/v1/scopes/<scope>/search/ on a scope of 100,000 memories.

    createdb -h 127.0.0.1 -U postgres mnesio_search_bench
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/mnesio_search_bench MNESIO_DEBUG=1 OMP_NUM_THREADS=1 \
      .venv/bin/python bench/search_index.py --memories 100000 --queries 300

Fills one scope through the real append path (1,000 per batch, indexed in the same transaction), then times
searches end to end through Django's test client. Text is synthetic: Zipf-distributed words (s = 1) over
30,000 words led by English function words ("the" in ~90% of memories), 8-40 words per memory; queries mix
frequent words with words of one memory, so most carry a term that matches most of the scope (the costly
case), a third filtered by subject or time. Also measured: what indexing adds to an append, forgetting one
memory and searching again, EXPLAIN ANALYZE of the ranking statement, and (--old-path) one search without the
index (decrypt the scope, index it with bm25s). Writes JSON to --out and prints it.
Target: p95 <= 50 ms at 100,000 memories on this 2-core machine.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FUNCTION_WORDS = ("the i to and a you of it that in is my was we for on he she they have with did what at be this "
                  "but about so when like do her his me are there not just from had all going think how where "
                  "go one get know time by an our up out if").split()


def _vocabulary(num_words: int, rng: random.Random) -> list[str]:
    words, seen = list(FUNCTION_WORDS), set(FUNCTION_WORDS)
    syllables = ["ka", "lo", "mi", "ren", "tu", "sa", "vor", "el", "ni", "da", "po", "ber", "ish", "an", "qu", "zo"]
    while len(words) < num_words:
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


class Text:
    """Synthetic memories and questions over one Zipf-distributed vocabulary."""

    def __init__(self, rng: random.Random, num_words: int = 30_000):
        self.rng = rng
        self.words = _vocabulary(num_words, rng)
        self.cum = list(itertools.accumulate(1.0 / rank for rank in range(1, num_words + 1)))

    def memory(self) -> str:
        n = self.rng.randint(8, 40)
        return " ".join(self.rng.choices(self.words, cum_weights=self.cum, k=n)).capitalize() + "."

    def question(self, memory: str) -> str:
        own = [w.strip(".").lower() for w in memory.split()]
        picked = self.rng.sample(own, min(len(own), self.rng.randint(2, 4)))
        frequent = self.rng.sample(FUNCTION_WORDS[:25], self.rng.randint(2, 3))
        words = frequent + picked
        self.rng.shuffle(words)
        return " ".join(words) + "?"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _summary(seconds: list[float]) -> dict:
    return {"p50_ms": round(1000 * statistics.median(seconds), 2), "p95_ms": round(1000 * _percentile(seconds, 0.95), 2),
            "max_ms": round(1000 * max(seconds), 2), "num": len(seconds)}


def _fill(scope, text: Text, num: int, batch: int) -> tuple[list[str], float]:
    from memories.services import memories_append_batch

    people = [f"person-{i}" for i in range(50)]
    contents, started = [], time.perf_counter()
    for start in range(0, num, batch):
        items = []
        for _ in range(min(batch, num - start)):
            content = text.memory()
            contents.append(content)
            items.append({"content": content, "subject": text.rng.choice(people) if text.rng.random() < 0.7 else None})
        memories_append_batch(scope=scope, items=items)
        if (start // batch) % 10 == 0:
            print(f"filled {start + len(items)} of {num}", file=sys.stderr, flush=True)
    return contents, time.perf_counter() - started


def _append_cost(scope, text: Text, num: int, batch_size: int, num_batches: int) -> dict:
    """Single appends and batches with the index write off and on, alternated (same process, same scope)."""
    from memories import search_index
    from memories.services import appends, memories_append_batch, memory_append

    real = search_index.memories_index
    times: dict[str, list[float]] = {"single_off": [], "single_on": [], "batch_off": [], "batch_on": []}

    def timed(on: bool, fn) -> float:
        appends.search_index.memories_index = real if on else (lambda **_: None)
        try:
            started = time.perf_counter()
            fn()
            return time.perf_counter() - started
        finally:
            appends.search_index.memories_index = real

    for i in range(num):
        for on in ((False, True) if i % 2 else (True, False)):
            times["single_on" if on else "single_off"].append(
                timed(on, lambda: memory_append(scope=scope, content=text.memory())))
    for i in range(num_batches):
        for on in ((False, True) if i % 2 else (True, False)):
            items = [{"content": text.memory()} for _ in range(batch_size)]
            times["batch_on" if on else "batch_off"].append(
                timed(on, lambda items=items: memories_append_batch(scope=scope, items=items)))
    out = {name: _summary(values) for name, values in times.items()}
    out["single_added_p50_ms"] = round(out["single_on"]["p50_ms"] - out["single_off"]["p50_ms"], 2)
    out["batch_added_p50_ms"] = round(out["batch_on"]["p50_ms"] - out["batch_off"]["p50_ms"], 2)
    out["batch_size"] = batch_size
    return out


def _explain(scope, query: str) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS) of the two statements a search runs on the index: the weights (every search),
    and the read of the query terms' postings (a process's first search with those terms)."""
    from collections import Counter

    from django.db import connection

    from memories import search_index

    key = search_index.index_key_for_read(scope=scope)
    counts = Counter(search_index.term_digest(key, token) for token in search_index.index_tokens(query))
    sql, params = search_index.weights_statement(scope, counts, 2**63 - 1)
    plans = {}
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        plans["weights"] = [row[0] for row in cursor.fetchall()]
        # what a process that holds nothing of the scope reads with them (memories.search_index.ranking._read)
        delta, delta_params = search_index.ranking._delta_statement(scope, search_index.ranking._empty(0), list(counts), None)
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql} UNION ALL {delta}", [*params, *delta_params])
        plans["first_read_of_a_process"] = [row[0] for row in cursor.fetchall()]
    return {"query": query, "plans": plans}


def run(*, num_memories: int, num_queries: int, top_k: int, seed: int = 11, batch: int = 1000,
        num_appends: int = 100, num_batches: int = 4, old_path: bool = False, vacuum: bool = True) -> dict:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from knox.models import AuthToken
    from rest_framework.test import APIClient

    from memories.models import Memory
    from memories.selectors import memories_search, memory_search
    from memories.services import memory_append, memory_forget_file, scope_create, scope_delete_file, scope_grant

    rng = random.Random(seed)
    text = Text(rng)
    scope = scope_create(name=f"search-index-bench-{uuid.uuid4().hex[:8]}")
    user = get_user_model().objects.create_user(username=f"bench-{uuid.uuid4().hex[:8]}", is_superuser=True)
    scope_grant(scope=scope, user=user)
    contents, fill_s = _fill(scope, text, num_memories, batch)
    seqs = list(Memory.objects.filter(scope=scope).order_by("seq").values_list("seq", flat=True))
    figures: dict = {
        "scenario": "search index", "num_memories": num_memories, "num_queries": num_queries, "top_k": top_k,
        "fill": {"seconds": round(fill_s, 1), "memories_per_s": round(num_memories / fill_s, 1), "batch": batch},
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), avg(length) FROM memories_searchdocument WHERE scope_id = %s", [scope.pk])
        num_docs, mean_len = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM memories_searchposting WHERE scope_id = %s", [scope.pk])
        figures["index"] = {"documents": num_docs, "mean_length": round(float(mean_len), 1),
                            "postings": cursor.fetchone()[0]}
        cursor.execute("SELECT pg_total_relation_size('memories_searchposting'), "
                       "pg_total_relation_size('memories_searchdocument')")
        postings_bytes, docs_bytes = cursor.fetchone()
        figures["index"].update(postings_mb=round(postings_bytes / 2**20, 1), documents_mb=round(docs_bytes / 2**20, 1))
    client = APIClient(HTTP_HOST=(settings.ALLOWED_HOSTS or ["localhost"])[0].lstrip(".").replace("*", "localhost"))
    client.credentials(HTTP_AUTHORIZATION=f"Token {AuthToken.objects.create(user=user)[1]}")
    url = f"/api/v1/scopes/{scope.name}/search/"
    created = list(Memory.objects.filter(scope=scope).order_by("seq").values_list("created_at", flat=True))
    middle = created[len(created) // 2].isoformat()

    def body(i: int) -> dict:
        query = text.question(rng.choice(contents))
        kind = i % 6
        if kind == 1:
            return {"query": query, "top_k": top_k, "subject": f"person-{rng.randrange(50)}"}
        if kind == 3:
            return {"query": query, "top_k": top_k, "since": middle}
        return {"query": query, "top_k": top_k}

    def measure(label: str) -> None:
        from memories import search_index

        search_index.ranking._cache.clear()  # as a new process: the first searches read their terms' postings
        cold = []
        for i in range(10):
            started = time.perf_counter()
            assert client.post(url, data=body(i), format="json").status_code == 200
            cold.append(time.perf_counter() - started)
        figures.setdefault("first_searches_of_a_process", {})[label] = _summary(cold)
        for i in range(10):  # warm-up: the connection, the key, the caches
            assert client.post(url, data=body(i), format="json").status_code == 200
        api, api_cpu, plain, filtered, hits = [], [], [], [], []
        for i in range(num_queries):
            data = body(i)
            started, cpu_started = time.perf_counter(), time.process_time()
            response = client.post(url, data=data, format="json")
            elapsed = time.perf_counter() - started
            api_cpu.append(time.process_time() - cpu_started)
            assert response.status_code == 200, response.content[:300]
            api.append(elapsed)
            (filtered if len(data) > 2 else plain).append(elapsed)
            hits.append(len(response.json()["results"]))
        selector = []
        for _ in range(min(100, num_queries)):
            query = text.question(rng.choice(contents))
            started = time.perf_counter()
            memory_search(scope=scope, query=query, k=top_k)
            selector.append(time.perf_counter() - started)
        # this process's CPU time per request (not PostgreSQL's): less sensitive to the other processes of the machine
        figures[label] = {"api": _summary(api), "api_process_cpu": _summary(api_cpu),
                          "api_unfiltered": _summary(plain), "api_filtered": _summary(filtered),
                          "memory_search": _summary(selector), "mean_hits": round(statistics.mean(hits), 2),
                          "met": _summary(api)["p95_ms"] <= 50, "load_avg": [round(x, 2) for x in os.getloadavg()]}
        print(label, json.dumps(figures[label]), file=sys.stderr, flush=True)

    with connection.cursor() as cursor:  # the planner's statistics, as autovacuum's analyze would have them
        cursor.execute("ANALYZE memories_searchposting")
        cursor.execute("ANALYZE memories_searchdocument")
    measure("search_after_fill")
    if vacuum:
        with connection.cursor() as cursor:  # the visibility map set, as autovacuum would: index-only scans
            cursor.execute("VACUUM ANALYZE memories_searchposting")
            cursor.execute("VACUUM ANALYZE memories_searchdocument")
        measure("search_after_vacuum")
    figures["explain"] = {
        "typical": _explain(scope, text.question(contents[len(contents) // 3])),
        "frequent_words_only": _explain(scope, "what did the i you and a"),
    }
    figures["append_cost"] = _append_cost(scope, text, num_appends, batch, num_batches)
    from memories import search_index

    cached = sum(held.seqs.nbytes + held.lengths.nbytes + held.subjects.nbytes + held.created.nbytes
                 + sum(term.docs.nbytes + term.tfs.nbytes for term in held.terms.values())
                 for held in search_index.ranking._cache.values())
    figures["process_cache"] = {"terms": sum(len(c.terms) for c in search_index.ranking._cache.values()),
                                "mb": round(cached / 2**20, 1)}
    # searches right after appends: each reads the postings appended past what it held (a delta)
    after_append = []
    for _ in range(30):
        memory_append(scope=scope, content=text.memory())
        started = time.perf_counter()
        assert client.post(url, data=body(0), format="json").status_code == 200
        after_append.append(time.perf_counter() - started)
    figures["search_after_each_append"] = _summary(after_append)

    # forget one memory in the big scope: the request, then the next search no longer returns it
    target = seqs[len(seqs) // 2]
    query = " ".join(w.strip(".").lower() for w in contents[len(contents) // 2].split())
    assert target in [r.seq for r in memory_search(scope=scope, query=query, k=5)]
    started = time.perf_counter()
    memory_forget_file(scope=scope, seq=target, requested_by=user)
    forget_s = time.perf_counter() - started
    assert target not in [h.seq for h in memories_search(scope=scope, query=query, top_k=100).hits]
    started = time.perf_counter()
    assert client.post(url, data=body(0), format="json").status_code == 200
    figures["forget_one"] = {"request_ms": round(1000 * forget_s, 1), "gone_from_next_search": True,
                             "next_search_ms": round(1000 * (time.perf_counter() - started), 1)}

    if old_path:
        from kvengine.retrieval import Bm25
        from memories.selectors import scope_memories_open

        started = time.perf_counter()
        opened = [m for m in scope_memories_open(scope=scope) if not m.erased]
        Bm25([m.text for m in opened], stem=True).ranked(text.question(contents[0]), top_k)
        figures["old_path_one_search_s"] = round(time.perf_counter() - started, 2)

    started = time.perf_counter()
    scope_delete_file(scope=scope, requested_by=user)
    figures["delete_scope"] = {"request_s": round(time.perf_counter() - started, 2)}
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM memories_searchposting WHERE scope_id = %s", [scope.pk])
        figures["delete_scope"]["postings_left"] = cursor.fetchone()[0]
    figures["target_p95_ms"] = 50
    figures["cpu_count"] = os.cpu_count()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--memories", type=int, default=100_000, help="memories in the scope (default 100,000)")
    parser.add_argument("--queries", type=int, default=300, help="timed API searches per measurement")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--appends", type=int, default=100, help="single appends timed with and without the index")
    parser.add_argument("--batches", type=int, default=4, help="1,000-item batches timed with and without the index")
    parser.add_argument("--old-path", action="store_true", help="also time one search the per-request way")
    parser.add_argument("--no-vacuum", action="store_true", help="skip the measurement after VACUUM")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/search_index.json")
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
        sys.exit("search_index measures PostgreSQL: set DATABASE_URL=postgres://...")
    if not args.no_migrate:
        call_command("migrate", interactive=False, verbosity=0)
    figures = run(num_memories=args.memories, num_queries=args.queries, top_k=args.top_k, seed=args.seed,
                  num_appends=args.appends, num_batches=args.batches, old_path=args.old_path,
                  vacuum=not args.no_vacuum)
    figures["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    figures["command"] = " ".join(["bench/search_index.py", *sys.argv[1:]])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
