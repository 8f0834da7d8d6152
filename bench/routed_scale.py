"""A routed scope of 200,000 tokens end to end: appended, compiled, gated, asked through the API, one memory forgotten.

    createdb -h 127.0.0.1 -U postgres mnesio_routed_bench
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/mnesio_routed_bench MNESIO_DEBUG=1 OMP_NUM_THREADS=2 \\
      .venv/bin/python bench/routed_scale.py --tokens 200000 --out bench/results/routed_scale.json

The embedded default (tasks in-process, the real SmolLM2-135M in f32) on PostgreSQL. One ``routed`` scope is
filled through the real batch append, whose hook compiles the new memories' chunks (sealed, q8 by default).
Memories are synthetic conversation turns (seeded, no dataset text); a few planted facts with unique values are
the questions asked and the gate's cases.
Measured: fill (append + chunk compile), storage (the sealed chunks' bytes against the table's size on disk),
the routed gate on the planted cases, asks through ``/api/v1/scopes/<s>/ask/`` (whole request and the answer's
``ttft_s``), freshness (one new memory appended, then asked about), and forgetting one planted memory
(``DELETE .../memories/<seq>/``: the request's time, its chunk row gone, a sample of other chunks' bytes
unchanged, the next ask no longer reading it), with this process's peak resident memory.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NAMES = ("Ava Liam Noah Emma Olivia Mason Sophia Lucas Mia Ethan Isla Leo Zoe Omar Lena Ravi Yuki Chen Maya Ivan "
         "Nora Felix Sara Tomas Ines Kofi Amara Hugo Elsa Dario").split()
PLACES = ("the lake, the old library, a bakery downtown, the climbing gym, her aunt's farm, the harbour, a jazz bar, "
          "the night market, the museum, the community garden, a ramen place, the train station").split(", ")
TOPICS = ("a new job offer, the wedding plans, a broken bike, learning the violin, a trip to Lisbon, the garden, "
          "a book club pick, moving flats, a marathon, a painting class, the kids' school, a camping weekend").split(", ")
FEELINGS = "excited, tired, nervous, relieved, proud, curious, happy, worried".split(", ")
ITEMS = "locker code, flight number, bike lock combination, room number, gate code, parking spot".split(", ")


class Turns:
    """Synthetic conversation turns with a fixed seed, and planted facts (a unique value each) to ask about."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.day = 0

    def turn(self) -> str:
        r = self.rng
        self.day += r.random() < 0.05
        a, b = r.sample(NAMES, 2)
        return (f"[day {self.day + 1}] {a}: I went to {r.choice(PLACES)} with {b} and we talked about "
                f"{r.choice(TOPICS)} for {r.randint(2, 90)} minutes. {b} said it made them feel {r.choice(FEELINGS)}, "
                f"and we might go back on day {self.day + r.randint(2, 30)}.")

    def fact(self, i: int) -> tuple[str, str, str]:
        """(memory, question, answer) of planted fact ``i``: a made-up owner so BM25 can find it."""
        owner = f"Quillon{i:02d}"
        item = ITEMS[i % len(ITEMS)]
        value = str(self.rng.randint(1000, 9999))
        return (f"[day {self.day + 1}] {owner}: Please remember that my {item} is {value}.",
                f"What is {owner}'s {item}?", value)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(seconds: list[float]) -> dict:
    return {"n": len(seconds), "p50_s": round(statistics.median(seconds), 3), "p95_s": round(_pct(seconds, 0.95), 3),
            "max_s": round(max(seconds), 3)}


def _rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def run(*, num_tokens: int, num_facts: int, batch: int, num_fresh: int, seed: int, resume: str | None = None,
        fill_log: Path | None = None) -> dict:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.db.models import Sum
    from knox.models import AuthToken
    from rest_framework.test import APIClient

    from cartridges import conf, engine
    from cartridges.models import EvaluationCase, RoutedChunk
    from cartridges.selectors import active_configuration
    from cartridges.services import evaluation_case_add
    from cartridges.services.routed_gate import routed_gate
    from cartridges.services.scope_settings import scope_settings_update
    from memories.models import Memory, Scope
    from memories.services import memories_append_batch, scope_create, scope_grant

    rng = random.Random(seed)
    turns = Turns(rng)
    config = active_configuration()
    backend = engine.backend_for(config)
    figures: dict = {"scenario": "routed scope at scale", "target_tokens": num_tokens, "batch": batch,
                     "repair": conf.routed_repair(), "chunk_quant": conf.routed_chunk_quant(),
                     "top_k": conf.routed_top_k(), "token_budget": conf.routed_token_budget(),
                     "window": backend.describe().max_context_tokens, "rss_mb_after_model_load": _rss_mb()}
    user = get_user_model().objects.create_user(username=f"bench-{uuid.uuid4().hex[:8]}", is_superuser=True)
    if resume:  # a scope an earlier run filled (--resume): the same seed replays its text to find the facts
        scope = Scope.objects.get(name=resume)
    else:
        scope = scope_create(name=f"routed-scale-{uuid.uuid4().hex[:8]}")
        scope_settings_update(scope=scope, layout="routed")
    scope_grant(scope=scope, user=user)
    config_key = engine.kv_config(config).key
    figures["scope"] = scope.name

    facts = [turns.fact(i) for i in range(num_facts)]
    every = max(1, num_tokens // (55 * batch) // num_facts)  # ~55 tokens a turn: the facts spread over the fill
    planted: dict[int, int] = {}  # fact index -> its memory's seq
    stored, batches = 0, []
    seqs = list(Memory.objects.filter(scope=scope).order_by("seq").values_list("seq", flat=True)) if resume else []
    while (len(batches) * batch < len(seqs)) if resume else (stored < num_tokens):
        items = [{"content": turns.turn()} for _ in range(batch)]
        fact = len(planted) if len(batches) % every == 0 and len(planted) < num_facts else None
        if fact is not None:
            items[batch // 2] = {"content": facts[fact][0]}
        if resume:
            if fact is not None:
                planted[fact] = seqs[len(batches) * batch + batch // 2]
            batches.append(0.0)
            continue
        t0 = time.perf_counter()
        outcomes = memories_append_batch(scope=scope, items=items)  # its commit compiles the new chunks
        batches.append(time.perf_counter() - t0)
        if fact is not None:
            planted[fact] = outcomes[batch // 2].memory.seq
        stored = RoutedChunk.objects.filter(scope=scope, config_key=config_key).aggregate(n=Sum("num_tokens"))["n"] or 0
        print(f"fill: {len(batches) * batch} memories, {stored} tokens, {sum(batches):.1f} s", file=sys.stderr, flush=True)
    if resume:
        stored = RoutedChunk.objects.filter(scope=scope, config_key=config_key).aggregate(n=Sum("num_tokens"))["n"]
        if fill_log is not None:  # the filling run's cumulative progress lines: its batches' times
            marks = [float(line.rsplit(",", 1)[1].strip().removesuffix(" s")) for line in fill_log.read_text().splitlines()
                     if line.startswith("fill: ")]
            batches = [b - a for a, b in zip([0.0, *marks], marks, strict=False)]
    num_facts = len(planted)
    fill_s = sum(batches)
    num_memories = Memory.objects.filter(scope=scope).count()
    num_chunks = RoutedChunk.objects.filter(scope=scope, config_key=config_key).count()
    figures["fill"] = {
        "memories": num_memories, "chunks": num_chunks, "chunk_tokens": stored, "windows": round(stored / figures["window"], 1),
        "seconds": round(fill_s, 1), "tokens_per_s": round(stored / fill_s, 1),
        "batch_s": _summary(batches), "rss_mb": _rss_mb(),
    }
    assert num_chunks == num_memories, (num_chunks, num_memories)  # every append compiled its own chunk

    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(octet_length(sealed)) FROM cartridges_routedchunk WHERE scope_id = %s", [scope.pk])
        sealed_bytes = int(cursor.fetchone()[0])
        cursor.execute("SELECT pg_total_relation_size('cartridges_routedchunk')")
        table_bytes = int(cursor.fetchone()[0])
    figures["storage"] = {
        "sealed_chunk_bytes": sealed_bytes, "bytes_per_token": round(sealed_bytes / stored, 1),
        "table_bytes_on_disk": table_bytes, "table_over_sealed": round(table_bytes / sealed_bytes, 3),
        "note": "one row per (memory, configuration); versions hold no chunk copies",
    }

    if not EvaluationCase.objects.filter(scope=scope).exists():  # a resumed run's cases were added by the first
        for i in range(num_facts):
            evaluation_case_add(scope=scope, question=facts[i][1], answers=[facts[i][2]])
    t0 = time.perf_counter()
    gate = routed_gate(scope=scope, config=config)
    figures["gate"] = {"seconds": round(time.perf_counter() - t0, 1), "passed": gate.passed, "reasons": gate.reasons,
                       **gate.figures}

    client = APIClient(HTTP_HOST=(settings.ALLOWED_HOSTS or ["localhost"])[0].lstrip(".").replace("*", "localhost"))
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AuthToken.objects.create(user=user)[1]}")
    ask_url = f"/api/v1/scopes/{scope.name}/ask/"

    def ask(question: str) -> tuple[dict, float]:
        t0 = time.perf_counter()
        response = client.post(ask_url, {"question": question}, format="json")
        elapsed = time.perf_counter() - t0
        assert response.status_code == 200, (response.status_code, response.content[:300])
        return response.json(), elapsed

    asks, ttfts, right, read_planted = [], [], 0, 0
    for i in range(num_facts):
        body, elapsed = ask(facts[i][1])
        asks.append(elapsed)
        ttfts.append(float(body.get("ttft_s") or 0.0))
        right += facts[i][2] in body["answer"]
        read_planted += planted[i] in (body.get("memory_seqs") or [])
    figures["asks"] = {"request": _summary(asks), "ttft": _summary(ttfts), "answers_with_the_value": right,
                       "planted_memory_read": read_planted, "questions": num_facts, "layout": body.get("layout"),
                       "rss_mb": _rss_mb()}

    fresh_append, fresh_answer, fresh_right = [], [], 0
    for i in range(num_fresh):
        memory, question, value = turns.fact(100 + i)
        t0 = time.perf_counter()
        response = client.post(f"/api/v1/scopes/{scope.name}/memories/", {"content": memory}, format="json")
        assert response.status_code == 201, (response.status_code, response.content[:300])
        fresh_append.append(time.perf_counter() - t0)  # the commit compiled its chunk: servable on return
        body, elapsed = ask(question)
        fresh_answer.append(fresh_append[-1] + elapsed)
        fresh_right += value in body["answer"]
    figures["freshness"] = {"append_to_servable": _summary(fresh_append),
                            "append_to_answer": _summary(fresh_answer), "answers_with_the_value": fresh_right,
                            "questions": num_fresh}

    victim = planted[0]
    others = list(RoutedChunk.objects.filter(scope=scope).exclude(memory__seq=victim).order_by("?")[:200])
    before = {row.pk: hashlib.sha256(bytes(row.sealed)).hexdigest() for row in others}
    t0 = time.perf_counter()
    response = client.delete(f"/api/v1/scopes/{scope.name}/memories/{victim}/")
    forget_s = time.perf_counter() - t0
    assert response.status_code == 202, (response.status_code, response.content[:300])
    after = {row.pk: hashlib.sha256(bytes(row.sealed)).hexdigest() for row in RoutedChunk.objects.filter(pk__in=before)}
    body, _ = ask(facts[0][1])
    figures["forget"] = {
        "request_s": round(forget_s, 3),
        "victim_chunk_rows_left": RoutedChunk.objects.filter(scope=scope, memory__seq=victim).count(),
        "other_chunks_sampled": len(before), "other_chunks_unchanged": sum(after.get(pk) == h for pk, h in before.items()),
        "chunks_left": RoutedChunk.objects.filter(scope=scope).count(),
        "next_ask_reads_it": victim in (body.get("memory_seqs") or []),
        "next_answer_has_the_value": facts[0][2] in body["answer"],
    }
    figures["rss_mb_peak"] = _rss_mb()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--tokens", type=int, default=200_000, help="chunk tokens to fill the scope with (default 200,000)")
    parser.add_argument("--facts", type=int, default=10, help="planted facts: the questions asked and the gate's cases")
    parser.add_argument("--batch", type=int, default=200, help="memories per batch append")
    parser.add_argument("--fresh", type=int, default=5, help="single appends asked about at once (freshness)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/routed_scale.json")
    parser.add_argument("--no-migrate", action="store_true")
    parser.add_argument("--resume", metavar="SCOPE", help="measure a scope an earlier run filled (same --seed, --batch, "
                        "--tokens, --facts) instead of filling one")
    parser.add_argument("--fill-log", type=Path, help="with --resume: that run's stderr, whose progress lines time its fill")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
    os.environ.setdefault("MNESIO_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    if not settings.IS_POSTGRES:
        sys.exit("routed_scale measures PostgreSQL: set DATABASE_URL=postgres://...")
    if not args.no_migrate:
        call_command("migrate", interactive=False, verbosity=0)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    figures = run(num_tokens=args.tokens, num_facts=args.facts, batch=args.batch, num_fresh=args.fresh, seed=args.seed,
                  resume=args.resume, fill_log=args.fill_log)
    figures["started_at"] = started
    figures["command"] = " ".join(["bench/routed_scale.py", *sys.argv[1:]])
    figures["threads"] = int(os.environ.get("OMP_NUM_THREADS", "0")) or None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
