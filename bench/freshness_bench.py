"""Freshness: from an append to an answer that uses the new memory, and to an active cartridge that holds it.

Through the real services, the real model (SmolLM2-135M, CPU f32):
- ``--mode embedded``: the embedded default (SQLite, in-process tasks; the scope's auto-refresh timer thread);
- ``--mode worker``: PostgreSQL + Redis (``DATABASE_URL``, ``REDIS_URL``) and a real Celery worker on the gpu queue.
A scope of ~``--tokens`` tokens is compiled and activated through the full gate first (times reported beside
the cycle) and switched to auto-refresh on append (``--debounce-s``); then ``--appends`` memories, each stating
a fact only it holds, are appended one at a time. For each: the question about it asked right after the append
(a fresh answer, services/serving.py) and checked for the fact (``append_to_fresh_answer_s``); then the time until
an active version holds it, asked again (``append_to_answer_s``).

    .venv/bin/python bench/freshness_bench.py --mode embedded --out bench/results/freshness-embedded.json
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/mnesio_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        .venv/bin/python bench/freshness_bench.py --mode worker --out bench/results/freshness-worker.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from blocks_bench import memories_for  # noqa: E402  (the same generated memories)


def _setup(mode: str, data_dir: str) -> None:
    os.environ.setdefault("MNESIO_DATA_DIR", data_dir)
    os.environ.setdefault("MNESIO_DEBUG", "true")
    os.environ.setdefault("SECURE_SSL_REDIRECT", "false")
    os.environ.setdefault("MNESIO_LOG_LEVEL", "WARNING")
    os.environ.setdefault("MNESIO_BLOB_ROOT", str(Path(data_dir) / "blobs"))
    if mode == "embedded":
        for name in ("DATABASE_URL", "REDIS_URL"):
            os.environ.pop(name, None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "mnesio_site.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _worker(env: dict[str, str], concurrency: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "mnesio_site", "worker", "-Q", "gpu,default", "-c", str(concurrency), "--pool", "prefork",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


def _full_gates_done(mode: str, scope) -> bool:
    """No scheduled full gate of the scope is pending or running (the timer threads, or the task's Redis marker)."""
    if mode == "embedded":
        from cartridges.services.refresh import refresh_timers_join

        return refresh_timers_join(1.0)
    from cartridges.channels import redis_client
    from cartridges.services.refresh import full_gate_marker

    client = redis_client()
    try:
        return not client.exists(full_gate_marker(scope.pk))
    finally:
        client.close()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["embedded", "worker"], default="embedded")
    parser.add_argument("--tokens", type=int, default=7400, help="scope size before the appends (ends near 8k)")
    parser.add_argument("--appends", type=int, default=20)
    parser.add_argument("--debounce-s", type=int, default=2, help="the scope's debounce (2: a new scope's default)")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker-concurrency", type=int, default=2,
                        help="worker processes (2: a scheduled full gate does not hold the next refresh back)")
    args = parser.parse_args()
    _setup(args.mode, tempfile.mkdtemp(prefix="mnesio-freshness-"))

    from cartridges import engine
    from cartridges.models import CartridgeActivation, CartridgeEvaluation
    from cartridges.selectors import active_configuration
    from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile, cartridge_evaluate
    from cartridges.services.scope_settings import scope_settings_update
    from memories.services import memory_append, scope_create

    backend = engine.backend_for(active_configuration())
    rng = random.Random(7)
    texts = memories_for(backend, rng, args.tokens)
    scope = scope_create(name=f"fresh-{os.getpid()}")
    for text in texts:
        memory_append(scope=scope, content=text)
    started = time.perf_counter()
    version = cartridge_compile(scope=scope)
    full_compile_s = time.perf_counter() - started
    started = time.perf_counter()
    evaluation = cartridge_evaluate(version=version)
    full_gate_s = time.perf_counter() - started
    assert evaluation.passed, evaluation.reasons
    cartridge_activate(version=version)
    print(json.dumps({"scope_tokens": version.num_tokens, "full_compile_s": round(full_compile_s, 2), "full_gate_s": round(full_gate_s, 2)}), flush=True)

    worker = None
    if args.mode == "worker":
        worker = _worker({**os.environ}, args.worker_concurrency)
        time.sleep(8)  # the worker's processes load the model as they start (MNESIO_WORKER_WARMUP): let them, before the first append
    scope_settings_update(scope=scope, actor=None, auto_refresh="on_append", auto_refresh_debounce_s=args.debounce_s)
    cycles, answers_ok, gates = [], 0, []
    try:
        for i in range(args.appends):
            code = rng.randint(10000, 99999)
            project = f"Zeta-{i}-{rng.randint(100, 999)}"
            appended_at = time.perf_counter()
            memory = memory_append(scope=scope, content=f"The vault code of project {project} is {code}.")
            fresh = cartridge_answer(scope=scope, question=f"What is the vault code of project {project}?")
            fresh_at = time.perf_counter()
            fresh_ok = str(code) in fresh.answer
            deadline = appended_at + args.timeout_s
            while True:
                activation = CartridgeActivation.objects.filter(scope=scope).select_related("version").order_by("-created_at", "-id").first()
                if activation and activation.version.log_head >= memory.seq:
                    break
                if time.perf_counter() > deadline:
                    raise SystemExit(f"append {i}: no active cartridge with seq {memory.seq} after {args.timeout_s} s")
                time.sleep(0.02)
            active_at = time.perf_counter()
            result = cartridge_answer(scope=scope, question=f"What is the vault code of project {project}?")
            answered_at = time.perf_counter()
            ok = str(code) in result.answer
            answers_ok += ok
            figures = activation.evaluation.figures or {}
            gate = figures.get("gate", "?")
            gates.append(gate)
            cycles.append({"append_to_fresh_answer_s": round(fresh_at - appended_at, 3), "fresh_answer_has_fact": fresh_ok,
                           "fresh_num_memories_after_version": fresh.num_memories_after_version,
                           "append_to_active_s": round(active_at - appended_at, 3), "answer_s": round(answered_at - active_at, 3),
                           "append_to_answer_s": round(answered_at - appended_at, 3), "answer_has_fact": ok, "gate": gate,
                           "gate_s": (figures.get("gate_cost") or {}).get("seconds"),
                           "full_gate_after": bool((figures.get("incremental") or {}).get("full_due")),
                           "version": activation.version_id})
            print(json.dumps(cycles[-1]), flush=True)
        # the scheduled full gates run after their activations (off the refresh path): wait for them to report them
        deadline = time.perf_counter() + 900
        while time.perf_counter() < deadline and not _full_gates_done(args.mode, scope):
            time.sleep(1)
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=30)
    full_gates = [{"version": e.version_id, "passed": e.passed, "seconds": (e.figures.get("gate_cost") or {}).get("seconds")}
                  for e in CartridgeEvaluation.objects.filter(version__scope=scope, figures__stage="scheduled_full_gate").order_by("id")]
    active = [c["append_to_active_s"] for c in cycles]
    answered = [c["append_to_answer_s"] for c in cycles]
    fresh_answered = [c["append_to_fresh_answer_s"] for c in cycles]
    report = {
        "mode": args.mode, "worker_concurrency": args.worker_concurrency if args.mode == "worker" else None,
        "threads": os.environ.get("OMP_NUM_THREADS"), "scope_tokens_before": version.num_tokens, "appends": args.appends, "debounce_s": args.debounce_s,
        "full_compile_s": round(full_compile_s, 2), "full_gate_s": round(full_gate_s, 2),
        "append_to_fresh_answer_p50_s": _pct(fresh_answered, 0.5), "append_to_fresh_answer_p95_s": _pct(fresh_answered, 0.95),
        "fresh_answers_with_the_new_fact": sum(c["fresh_answer_has_fact"] for c in cycles),
        "append_to_active_p50_s": _pct(active, 0.5), "append_to_active_p95_s": _pct(active, 0.95),
        "append_to_answer_p50_s": _pct(answered, 0.5), "append_to_answer_p95_s": _pct(answered, 0.95),
        "append_to_active_mean_s": round(statistics.mean(active), 3), "answers_with_the_new_fact": answers_ok,
        "gates": {g: gates.count(g) for g in set(gates)}, "scheduled_full_gates": full_gates, "cycles": cycles,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "cycles"}), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
