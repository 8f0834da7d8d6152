"""Append load: N OS processes x M appends (or M batches of B) on PostgreSQL, with a reader following the log.

Checks: seqs exactly start+1..start+N*M (0 gaps, 0 duplicates), each writer's appends in its own order, the
log head moved by N*M, and the follower never saw a position appear below one it had read nor a hole above
it. Reports appends/s and per-append latency.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/mnesio_bench \
      .venv/bin/python bench/reliability/append_load.py --processes 8 --appends 500 \
      --out bench/reliability/results/append_load.json
    # batch writers: --processes 4 --appends 10 --batch 500 (memories_append_batch), same checks

The database is migrated first (``--no-migrate`` to skip). The master key is the one this process resolves,
handed to the children. tests/reliability/test_load.py imports ``run_load`` with small numbers.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# One appending OS process, also run by tests/memories/test_concurrent_appends.py. argv: scope name, writer
# number, number of appends (of batches with a batch size), key mode ("own" or "shared"), ready file, go file,
# latencies file, and optionally the batch size (default 1: memory_append; more: memories_append_batch, whose
# items are numbered on across batches, so the keys and texts are the same as with single appends).
WRITER = """
import json, os, sys, time
import django
django.setup()
from memories.models import Scope
from memories.services import memories_append_batch, memory_append
scope_name, worker, count, key_mode, ready, go, out = sys.argv[1:8]
batch = int(sys.argv[8]) if len(sys.argv) > 8 else 1
scope = Scope.objects.get(name=scope_name)
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)

def item(i):
    # "own": every writer its own keys; "shared": all writers race on the same keys (idempotency)
    key = f"shared-{i}" if key_mode == "shared" else f"w{worker}-{i}"
    content = f"fact {i}" if key_mode == "shared" else f"writer {worker} fact {i}"
    return {"content": content, "idempotency_key": key}

latencies = []
for n in range(int(count)):
    started = time.perf_counter()
    if batch == 1:
        memory_append(scope=scope, **item(n))
    else:
        memories_append_batch(scope=scope, items=[item(n * batch + j) for j in range(batch)])
    latencies.append(time.perf_counter() - started)
json.dump(latencies, open(out, "w"))
"""

READER = """
import json, os, sys, time
import django
django.setup()
from memories.models import Memory
start, ready, stop, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
last, num_seen, num_polls, below, holes, duplicates = start, 0, 0, 0, 0, 0
open(ready, "w").close()
final = False
while True:
    final = os.path.exists(stop)
    seqs = list(Memory.objects.filter(seq__gt=last).order_by("seq").values_list("seq", flat=True))
    # rows at or below the position already read: a late commit would show up here
    at_or_below = Memory.objects.filter(seq__gt=start, seq__lte=last).count()
    if at_or_below != num_seen:
        below += abs(at_or_below - num_seen)
    for seq in seqs:
        if seq <= last:
            duplicates += 1
        elif seq != last + 1:
            holes += 1
        last = max(last, seq)
        num_seen += 1
    num_polls += 1
    if final:
        break
    time.sleep(0.001)
json.dump({"num_seen": num_seen, "num_polls": num_polls, "below": below, "holes": holes,
           "duplicates": duplicates, "last": last}, open(out, "w"))
"""


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_load(
    *, num_processes: int, num_appends: int, database_url: str, master_key: bytes, batch_size: int = 1
) -> dict:
    """Run the scenario against ``database_url`` (migrated) and return its figures and checks.

    With ``batch_size`` > 1 each writer sends ``num_appends`` batches of ``batch_size`` memories.
    """
    from memories.models import Memory
    from memories.selectors import log_head
    from memories.services import scope_create

    scope_name = f"load-{uuid.uuid4().hex[:10]}"
    scope = scope_create(name=scope_name)
    start = log_head()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "mnesio_site.settings",
        "DATABASE_URL": database_url,
        "MNESIO_MASTER_KEY": base64.urlsafe_b64encode(master_key).decode(),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "MNESIO_LOG_LEVEL": "WARNING",
    }
    env.pop("MNESIO_MASTER_KEY_FILE", None)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        go, stop = tmp / "go", tmp / "stop"
        reader_ready, reader_out = tmp / "reader-ready", tmp / "reader.json"
        reader = subprocess.Popen(
            [sys.executable, "-c", READER, str(start), str(reader_ready), str(stop), str(reader_out)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        writers = []
        for i in range(num_processes):
            args = [scope_name, str(i), str(num_appends), "own", str(tmp / f"ready-{i}"), str(go),
                    str(tmp / f"lat-{i}.json"), str(batch_size)]
            writers.append(subprocess.Popen([sys.executable, "-c", WRITER, *args], cwd=ROOT, env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 300
        readies = [tmp / f"ready-{i}" for i in range(num_processes)] + [reader_ready]
        while not all(p.exists() for p in readies):
            dead = [p for p in [*writers, reader] if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError("a load process did not start: " + dead[0].communicate()[0].decode()[-3000:] if dead else "timeout")
            time.sleep(0.02)
        started = time.perf_counter()
        go.touch()
        for proc in writers:
            out, _ = proc.communicate(timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError("a writer failed: " + out.decode()[-3000:])
        seconds = time.perf_counter() - started
        stop.touch()
        out, _ = reader.communicate(timeout=300)
        if reader.returncode != 0:
            raise RuntimeError("the reader failed: " + out.decode()[-3000:])
        follower = json.loads(reader_out.read_text())
        latencies = [x for i in range(num_processes) for x in json.loads((tmp / f"lat-{i}.json").read_text())]

    per_writer = num_appends * batch_size
    total = num_processes * per_writer
    seqs = list(Memory.objects.filter(seq__gt=start).order_by("seq").values_list("seq", flat=True))
    mine = list(Memory.objects.filter(scope=scope).order_by("seq").values_list("seq", "idempotency_key"))
    expected = list(range(start + 1, start + total + 1))
    num_duplicates = len(seqs) - len(set(seqs))
    num_gaps = len(set(expected) - set(seqs))
    per_writer_in_order = all(
        [int(k.split("-")[1]) for _, k in mine if k.startswith(f"w{w}-")] == list(range(per_writer))
        for w in range(num_processes)
    )
    # one batch, one transaction: its rows hold consecutive seqs (no other writer's row in between)
    by_batch: dict[tuple[int, int], list[int]] = {}
    for seq, key in mine:
        w, i = key[1:].split("-")
        by_batch.setdefault((int(w), int(i) // batch_size), []).append(seq)
    batches_contiguous = all(sorted(s) == list(range(min(s), min(s) + len(s))) for s in by_batch.values())
    return {
        "scenario": "append load" if batch_size == 1 else "batch append load",
        "batches_contiguous": batches_contiguous,
        "num_processes": num_processes,
        "num_appends_per_process": num_appends,
        "batch_size": batch_size,
        "num_memories_per_process": per_writer,
        "num_rows": len(mine),
        "expected_rows": total,
        "num_gaps": num_gaps,
        "num_duplicates": num_duplicates,
        "seqs_exact": seqs == expected and len(mine) == total,
        "per_writer_in_order": per_writer_in_order,
        "head_moved_by": log_head() - start,
        "seconds": round(seconds, 3),
        "appends_per_s": round(total / seconds, 1),  # memories per second (batches count each memory)
        "calls_per_s": round(num_processes * num_appends / seconds, 1),
        "latency_ms": {  # per call: one append, or one batch
            "p50": round(1000 * statistics.median(latencies), 2),
            "p95": round(1000 * _percentile(latencies, 0.95), 2),
            "max": round(1000 * max(latencies), 2),
        },
        "follower": {
            "rows_seen": follower["num_seen"],
            "polls": follower["num_polls"],
            "positions_appearing_below_read": follower["below"],
            "holes_seen": follower["holes"],
            "duplicates_seen": follower["duplicates"],
        },
        "cpu_count": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--appends", type=int, default=500, help="appends (or batches) per process")
    parser.add_argument("--batch", type=int, default=1, help="memories per call (1: memory_append)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/reliability/results/append_load.json")
    parser.add_argument("--no-migrate", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
    os.environ.setdefault("MNESIO_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from memories import crypto

    if not settings.IS_POSTGRES:
        sys.exit("append_load needs PostgreSQL: set DATABASE_URL=postgres://...")
    if not args.no_migrate:
        call_command("migrate", interactive=False, verbosity=0)
    figures = run_load(
        num_processes=args.processes, num_appends=args.appends, batch_size=args.batch,
        database_url=os.environ["DATABASE_URL"], master_key=crypto.master_key(),
    )
    figures["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    ok = (figures["seqs_exact"] and figures["per_writer_in_order"] and figures["batches_contiguous"]
          and figures["num_gaps"] == 0
          and figures["num_duplicates"] == 0 and figures["follower"]["positions_appearing_below_read"] == 0
          and figures["follower"]["holes_seen"] == 0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
