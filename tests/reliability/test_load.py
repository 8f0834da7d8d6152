"""Load, at test size: concurrent appends with a follower (bench/reliability/append_load.py, 4 x 50 here,
8 x 500 in docs/guarantees.md) and client threads asking one active cartridge of the real model
(bench/reliability/answer_load.py, 4 x 3 here, 4 x 50 in docs/guarantees.md)."""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
from django.db import connection

from memories import crypto
from tests.support.procs import database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "reliability"


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_reliability_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_concurrent_appends_leave_no_gap_no_duplicate_and_the_follower_never_sees_the_past_change(record_figures):
    assert connection.vendor == "postgresql"
    figures = _bench("append_load").run_load(
        num_processes=4, num_appends=50, database_url=database_url(), master_key=crypto.master_key()
    )
    record_figures(**figures)
    assert figures["seqs_exact"] and figures["num_rows"] == 200
    assert figures["num_gaps"] == 0 and figures["num_duplicates"] == 0
    assert figures["per_writer_in_order"] and figures["head_moved_by"] == 200
    follower = figures["follower"]
    assert follower["rows_seen"] == 200 and follower["polls"] >= 2
    assert follower["positions_appearing_below_read"] == 0 and follower["holes_seen"] == 0
    assert follower["duplicates_seen"] == 0


def test_concurrent_batch_writers_leave_no_gap_and_keep_each_batch_in_order(record_figures):
    # 4 processes x 3 batches of 40, racing each other and a follower: 480 rows, seqs exactly consecutive
    figures = _bench("append_load").run_load(
        num_processes=4, num_appends=3, batch_size=40, database_url=database_url(), master_key=crypto.master_key()
    )
    record_figures(**figures)
    assert figures["seqs_exact"] and figures["num_rows"] == 480 and figures["head_moved_by"] == 480
    assert figures["num_gaps"] == 0 and figures["num_duplicates"] == 0 and figures["per_writer_in_order"]
    assert figures["batches_contiguous"]
    follower = figures["follower"]
    assert follower["rows_seen"] == 480
    assert follower["positions_appearing_below_read"] == 0 and follower["holes_seen"] == 0
    assert follower["duplicates_seen"] == 0


@pytest.mark.model
def test_threads_asking_one_cartridge_get_the_single_threaded_answers(settings, real_backend, eager_tasks, record_figures,
                                                                     small_gate):
    from cartridges import engine

    config = ("transformers", "smollm2-135m-instruct", "f32", "none")
    settings.MNESIO_KV_BACKEND, settings.MNESIO_KV_MODEL, settings.MNESIO_KV_DTYPE, settings.MNESIO_KV_QUANT = config
    settings.MNESIO_ANSWER_MAX_NEW_TOKENS = 8  # short answers keep the test in seconds on 2 cores
    engine.register_backend(config, real_backend)
    bench = _bench("answer_load")
    started = time.perf_counter()
    scope = bench.serving_scope(backend_config=config)  # compile, gate (real model) and activate
    setup_s = time.perf_counter() - started
    figures = bench.run_answer_load(scope=scope, questions=bench.QUESTIONS, num_threads=4, num_per_thread=3)
    record_figures(**figures, setup_s_compile_gate_activate=round(setup_s, 1))
    assert not figures["errors"], figures["errors"]
    assert figures["num_answers"] == 12
    assert figures["num_mismatches"] == 0, figures["mismatches"]
