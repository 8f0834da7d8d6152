"""Answer load: T client threads x Q questions against one active cartridge; every answer must equal the
single-threaded answer to the same question (greedy decoding is deterministic; this checks it under contention).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/mnesio_bench MNESIO_ANSWER_MAX_NEW_TOKENS=8 \
      .venv/bin/python bench/reliability/answer_load.py --threads 4 --questions 50 \
      --out bench/reliability/results/answer_load.json

``--via async`` asks through the async path (``"async": true`` on /ask/: a sealed AnswerRequest answered by a
gpu worker, collected once) and starts that worker itself (``celery -A mnesio_site worker -Q gpu -P threads``,
the same environment); it needs Redis (``REDIS_URL``).

Uses the real default model (SmolLM2-135M-Instruct, f32, CPU) through cartridges.services: a scope with a
few memories is compiled, gated and activated, then asked. tests/reliability/test_load.py imports
``run_answer_load`` with small numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MEMORIES = [
    "The spare key is under the blue flowerpot.",
    "Dana's locker code is 4417.",
    "The car is parked on level 3 of the garage.",
    "The team meeting moved to Thursday at 10.",
    "Erin is allergic to peanuts.",
]
QUESTIONS = [
    "Where is the spare key?",
    "What is Dana's locker code?",
    "Where is the car parked?",
    "When is the team meeting?",
    "What is Erin allergic to?",
]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ask_async(*, scope, question: str, timeout_s: float = 300.0):
    """Ask through the async path (file, a gpu worker answers, collect once) and return the AnswerResult."""
    from cartridges import asking

    request = asking.answer_ask_async(scope=scope, question=question)
    deadline = time.monotonic() + timeout_s
    while (result := asking.answer_request_collect_for(scope=scope, pk=request.pk, user=None)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"answer request {request.pk} not answered within {timeout_s} s")
        time.sleep(0.02)
    return result


def run_answer_load(*, scope, questions: list[str], num_threads: int, num_per_thread: int, ask=None) -> dict:
    """Ask single-threaded once per question (this process's engine), then from ``num_threads`` threads with
    ``ask`` (default: the same engine; ``ask_async``: through gpu workers); compare every answer."""
    from django.db import connection

    from cartridges.services import cartridge_answer

    ask = ask or cartridge_answer

    baseline, single = {}, []
    for question in questions:
        started = time.perf_counter()
        result = cartridge_answer(scope=scope, question=question)
        single.append(time.perf_counter() - started)
        baseline[question] = (result.answer, result.version_id)

    mismatches: list[dict] = []
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(num_threads)

    def client(index: int) -> None:
        try:
            barrier.wait()
            for i in range(num_per_thread):
                question = questions[(index + i) % len(questions)]  # threads ask different questions at once
                started = time.perf_counter()
                result = ask(scope=scope, question=question)
                elapsed = time.perf_counter() - started
                with lock:
                    latencies.append(elapsed)
                    if (result.answer, result.version_id) != baseline[question]:
                        mismatches.append({"thread": index, "question": i, "got": result.answer[:80]})
        except Exception as exc:  # reported, and fails the run
            with lock:
                errors.append(f"thread {index}: {type(exc).__name__}: {exc}")
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(num_threads)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    return {
        "scenario": "answer load",
        "num_threads": num_threads,
        "num_questions_per_thread": num_per_thread,
        "num_distinct_questions": len(questions),
        "num_answers": len(latencies),
        "num_mismatches": len(mismatches),
        "mismatches": mismatches[:10],
        "errors": errors[:10],
        "single_thread_s_per_answer": round(statistics.mean(single), 4),
        "threaded_seconds": round(seconds, 3),
        "threaded_answers_per_s": round(len(latencies) / seconds, 2) if seconds else None,
        "latency_s": {"p50": round(statistics.median(latencies), 4), "p95": round(_percentile(latencies, 0.95), 4)}
        if latencies else None,
    }


def serving_scope(*, backend_config: tuple[str, str, str, str]):
    """Create a scope with MEMORIES, switch to ``backend_config``, compile, gate and activate; return the scope."""
    from cartridges.services import cartridge_activate, cartridge_compile, kv_configuration_switch
    from memories.services import memory_append, scope_create

    backend, model, dtype, quant = backend_config
    kv_configuration_switch(backend=backend, model=model, dtype=dtype, quant=quant, actor=None)
    scope = scope_create(name=f"answers-{uuid.uuid4().hex[:10]}")
    for text in MEMORIES:
        memory_append(scope=scope, content=text)
    cartridge_activate(version=cartridge_compile(scope=scope))
    return scope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--questions", type=int, default=50, help="questions per thread")
    parser.add_argument("--backend", default="transformers", choices=["transformers", "fake"])
    parser.add_argument("--via", default="local", choices=["local", "async"],
                        help="local: this process's engine; async: AnswerRequests answered by a gpu worker it starts")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/reliability/results/answer_load.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
    os.environ.setdefault("MNESIO_ANSWER_MAX_NEW_TOKENS", "8")
    os.environ.setdefault("MNESIO_LOG_LEVEL", "WARNING")
    if args.via == "local":
        os.environ.setdefault("CELERY_BROKER_URL", "")  # nothing queued to a broker by the configuration switch
    elif not os.environ.get("REDIS_URL"):
        sys.exit("--via async needs REDIS_URL (the broker the gpu worker reads)")
    import django

    django.setup()
    from django.core.management import call_command

    from mnesio_site.celery import app

    app.conf.task_always_eager = True
    call_command("migrate", interactive=False, verbosity=0)
    model = "smollm2-135m-instruct" if args.backend == "transformers" else "fake-model"
    started = time.perf_counter()
    scope = serving_scope(backend_config=(args.backend, model, "f32", "none"))
    setup_s = time.perf_counter() - started
    worker = None
    if args.via == "async":
        import subprocess

        app.conf.task_always_eager = False
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "mnesio_site", "worker", "-Q", "gpu", "-P", "threads",
             "-c", str(args.threads), "--without-gossip", "--without-mingle", "--loglevel", "WARNING"],
            cwd=ROOT, env={**os.environ, "MNESIO_LOG_LEVEL": "WARNING"},
        )
    try:
        if worker is not None:  # untimed: the worker has started (and loaded its model) before the clock runs
            ask_async(scope=scope, question=QUESTIONS[0])
        figures = run_answer_load(scope=scope, questions=QUESTIONS, num_threads=args.threads,
                                  num_per_thread=args.questions, ask=ask_async if args.via == "async" else None)
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=60)
    figures.update(via=args.via)
    figures.update(backend=args.backend, model=model, max_new_tokens=int(os.environ["MNESIO_ANSWER_MAX_NEW_TOKENS"]),
                   setup_s_model_load_compile_gate=round(setup_s, 1), cpu_count=os.cpu_count(),
                   started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    sys.exit(0 if figures["num_mismatches"] == 0 and not figures["errors"] else 1)


if __name__ == "__main__":
    main()
