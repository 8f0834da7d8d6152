"""Append speed from one process on PostgreSQL: single appends (latency) and batches (memories per second).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/mnesio_bench \\
      .venv/bin/python bench/append_speed.py --singles 300 --batches 10 --batch-size 500 \\
      --out bench/results/append_speed.json

Single: ``memory_append`` with an idempotency key and, every other one, a subject (as the load bench's writers
and a typical client do); latency p50/p95 per call. Batch: ``memories_append_batch`` of ``--batch-size`` items
(keys, 5 subjects, metadata on every tenth); memories per second over the batches. Each figure is taken after a
warm-up (connection, master-key check, first subject keys), in a fresh scope, on a migrated database.
``--profile`` prints where a single append's time goes (cProfile, top functions by own time).

Side by side with another checkout (``--code``; a separate database migrated by that checkout):

    PYTHONDONTWRITEBYTECODE=1 DATABASE_URL=postgres://postgres@127.0.0.1:5432/mnesio_bench_old \
      .venv/bin/python bench/append_speed.py --code /path/to/older/checkout --batches 0 --out /tmp/old.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_speed(*, num_singles: int, num_batches: int, batch_size: int, profile: bool = False) -> dict:
    """Measure, and return the figures (plus the number of SQL statements of one single append)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from memories.services import memory_append, scope_create

    scope = scope_create(name=f"speed-{uuid.uuid4().hex[:10]}")
    for i in range(20):  # warm-up
        memory_append(scope=scope, content=f"warm-up {i}", idempotency_key=f"warm-{i}", subject="p0" if i % 2 else None)

    def single(i: int) -> None:
        memory_append(scope=scope, content=f"single fact {i}: the standup moved to 9:30 on Tuesdays.",
                      idempotency_key=f"single-{i}", subject=f"p{i % 5}" if i % 2 else None)

    with CaptureQueriesContext(connection) as captured:  # a typical append: a subject seen before
        memory_append(scope=scope, content="counted", idempotency_key="counted", subject="p0")
    with CaptureQueriesContext(connection) as captured_no_subject:
        memory_append(scope=scope, content="counted too", idempotency_key="counted-2")
    latencies = []
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    for i in range(num_singles):
        started = time.perf_counter()
        single(i)
        latencies.append(time.perf_counter() - started)
    if profiler is not None:
        import pstats

        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)

    def items(b: int) -> list[dict]:
        return [
            {"content": f"batch {b} fact {i}: the standup moved to 9:30 on Tuesdays.", "idempotency_key": f"b{b}-{i}",
             "subject": f"p{i % 5}" if i % 2 else None, **({"metadata": {"source": "import", "n": i}} if i % 10 == 0 else {})}
            for i in range(batch_size)
        ]

    batch_seconds = []
    if num_batches:
        from memories.services import memories_append_batch  # absent from checkouts before batches (--code)

        memories_append_batch(scope=scope, items=items(-1))  # warm-up
    for b in range(num_batches):
        batch = items(b)
        started = time.perf_counter()
        memories_append_batch(scope=scope, items=batch)
        batch_seconds.append(time.perf_counter() - started)
    batch_figures = {}
    if batch_seconds:
        batch_figures = {
            "num_batches": num_batches,
            "batch_size": batch_size,
            "memories_per_s": round(num_batches * batch_size / sum(batch_seconds), 1),
            "batch_ms": {"p50": round(1000 * statistics.median(batch_seconds), 1),
                         "max": round(1000 * max(batch_seconds), 1)},
        }
    return {
        "scenario": "append speed, one process",
        "single": {
            "num": num_singles,
            "statements_per_append": len(captured.captured_queries),
            "statements_per_append_without_subject": len(captured_no_subject.captured_queries),
            "latency_ms": {"p50": round(1000 * statistics.median(latencies), 2),
                           "p95": round(1000 * _percentile(latencies, 0.95), 2)},
            "appends_per_s": round(num_singles / sum(latencies), 1),
        },
        "batch": batch_figures,
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--singles", type=int, default=300)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/append_speed.json")
    parser.add_argument("--no-migrate", action="store_true")
    parser.add_argument("--code", type=Path, default=ROOT,
                        help="the checkout whose code to measure (an older one for a side-by-side; with --batches 0 "
                        "before batches existed); its migrations are applied to DATABASE_URL")
    args = parser.parse_args()
    sys.path.insert(0, str(args.code))
    args.out = args.out.resolve()
    os.chdir(args.code)  # Celery's app loading puts the working directory first on sys.path
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
    os.environ.setdefault("MNESIO_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    if not settings.IS_POSTGRES:
        sys.exit("append_speed needs PostgreSQL: set DATABASE_URL=postgres://...")
    if not args.no_migrate:
        call_command("migrate", interactive=False, verbosity=0)
    figures = run_speed(num_singles=args.singles, num_batches=args.batches, batch_size=args.batch_size,
                        profile=args.profile)
    import memories

    figures["code"] = str(Path(memories.__file__).resolve().parents[1])
    figures["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
