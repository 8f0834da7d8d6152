"""Block cartridges: what an append and an erasure cost, and what 50 appends store.

Engine level, the real model (SmolLM2-135M, CPU f32 by default), in one process and one run:
- append: a ~8k-token scope compiled from scratch vs. plus one ~60-token memory reusing the stored blocks;
- erase: a memory in the last eighth of the scope removed, reusing the blocks before it vs. from scratch;
- storage: a scope grown by 50 appends from ~4k to ~7k tokens, stored by parts with each block once, against
  the largest single version and against whole blobs per version;
- byte identity: every incremental version's digest equals a from-scratch compile's;
- the freshness cycle at engine level: incremental compile and parts, the incremental gate's check
  (``verify_extension``), and an answer about the new memory (bench/freshness_bench.py: through the services).

    .venv/bin/python bench/blocks_bench.py --out bench/results/blocks.json

The memories are generated sentences (people, places, numbers) so the figures do not depend on a dataset.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvengine import make_backend  # noqa: E402

NAMES = "Ada Bruno Chen Dara Emeka Farah Goran Hana Ivo Jun Kemal Lena Milo Nadia Oren Priya Quinn Rosa Sami Tova".split()
PLACES = "Lisbon Osaka Tromso Lagos Quito Hanoi Tbilisi Perth Cusco Graz Nairobi Oslo Porto Dakar Lima".split()
THINGS = "bicycle violin greenhouse ledger telescope kayak lantern herbarium loom compass atlas kiln".split()


def memory(rng: random.Random, i: int) -> str:
    """One generated memory of ~55-65 tokens."""
    a, b = rng.sample(NAMES, 2)
    return (
        f"Note {i}: {a} met {b} in {rng.choice(PLACES)} on day {rng.randint(1, 365)} of year {rng.randint(1990, 2030)}; "
        f"{a} lent {b} a {rng.choice(THINGS)} worth {rng.randint(10, 9999)} euros, to be returned by the "
        f"{rng.randint(1, 28)}th, and {b} promised to bring back {rng.randint(2, 40)} jars of {rng.choice(PLACES)} honey."
    )


def memories_for(backend, rng: random.Random, target_tokens: int, start: int = 0) -> list[str]:
    texts: list[str] = []
    while not texts or backend.count_tokens(texts) < target_tokens:
        texts.append(memory(rng, start + len(texts)))
    return texts


def timed(fn):
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8000, help="scope size for the append and erase figures")
    parser.add_argument("--grow-from", type=int, default=4000)
    parser.add_argument("--appends", type=int, default=50)
    parser.add_argument("--dtype", default="f32")
    parser.add_argument("--quant", default="none")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--parts", default="append,cycle,erase,storage", help="which figures to measure (append is needed by cycle and erase)")
    parser.add_argument("--keep", default="0,3,10", help="retention settings (keep_previous_versions) the storage figure is also given for")
    args = parser.parse_args()
    rng = random.Random(13)
    backend = make_backend("transformers", dtype=args.dtype, quant=args.quant, device=args.device)
    report: dict = {"machine": {"cpu": platform.processor() or platform.machine(), "threads": os.environ.get("OMP_NUM_THREADS")},
                    "config": vars(args) | {"out": str(args.out)}}

    parts_wanted = set(args.parts.split(","))
    # -- append -------------------------------------------------------------------------------------------
    texts = memories_for(backend, rng, args.tokens) if parts_wanted & {"append", "cycle", "erase"} else []
    if not texts:
        report["append"] = None
    else:
        report.update(_append_cycle_erase(backend, rng, texts, parts_wanted))
    _storage(backend, rng, args, report)


def _append_cycle_erase(backend, rng, texts, parts_wanted):
    report = {}
    base, full_s = timed(lambda: backend.compile(texts))
    parts = backend.dump_parts(base)
    store = {ref.block_id: data for ref, data in parts.blocks}
    new = memory(rng, 10_000)
    grown, inc_s = timed(lambda: backend.compile([*texts, new], blocks=store.get))
    scratch = backend.compile([*texts, new])
    report["append"] = {
        "scope_tokens": base.header.num_tokens, "new_memory_tokens": grown.header.num_tokens - base.header.num_tokens,
        "full_compile_s": round(full_s, 3), "full_model_s": base.stats["compute_s"],
        "incremental_compile_s": round(inc_s, 3), "incremental_model_s": grown.stats["compute_s"],
        "model_time_ratio": round(grown.stats["compute_s"] / base.stats["compute_s"], 4),
        "blocks_reused": grown.stats["blocks_reused"], "blocks_computed": grown.stats["blocks_computed"],
        "byte_identical_to_scratch": backend.dump_parts(grown).digest == backend.dump_parts(scratch).digest,
    }
    print(json.dumps({"append": report["append"]}), flush=True)

    # -- the freshness cycle at engine level: incremental compile + parts, the incremental gate's check (the new part
    # re-read once on the verified blocks, probes as the gate makes them: 4 evenly spaced + 4 about the newest
    # memories, 8 tokens each), and a 32-token answer about the new memory from the new cartridge
    if "cycle" in parts_wanted and hasattr(backend, "verify_extension"):
        fact = f"The vault code of project Zeta-{rng.randint(100, 999)} is {rng.randint(10000, 99999)}."
        project, code = fact.split("project ")[1].split(" is ")[0], fact.rsplit(" ", 1)[1].rstrip(".")
        cycle_started = time.perf_counter()
        fresh = backend.compile([*texts, fact], blocks=store.get)
        fresh_parts = backend.dump_parts(fresh)
        compiled_at = time.perf_counter()
        every = [texts[round(i * (len(texts) - 1) / 3)] for i in range(4)]
        probes = [f"What do you remember about: {' '.join(t.split()[:6])}?" for t in [*every, *texts[-3:], fact]]
        check = backend.verify_extension(fresh, [*texts, fact], probes, num_verified_blocks=fresh.stats["blocks_reused"], max_new_tokens=8)
        checked_at = time.perf_counter()
        answer = backend.answer(fresh, f"What is the vault code of project {project}?", max_new_tokens=32)
        done_at = time.perf_counter()
        report["cycle"] = {
            "compile_and_parts_s": round(compiled_at - cycle_started, 3), "incremental_check_s": round(checked_at - compiled_at, 3),
            "answer_s": round(done_at - checked_at, 3), "total_s": round(done_at - cycle_started, 3),
            "check": check.as_dict(), "top1_agreement": check.fidelity.top1_agreement, "answer_has_fact": code in answer.text,
            "stored_bytes_new": sum(len(data) for ref, data in fresh_parts.blocks if ref.block_id not in store) + len(fresh_parts.tail),
        }
        print(json.dumps({"cycle": report["cycle"]}), flush=True)

    # -- erase a memory in the last eighth ------------------------------------------------------------------
    if "erase" not in parts_wanted:
        return report
    positions = base.stats["memory_positions"]
    victim = next(i for i, p in enumerate(positions) if p >= base.header.num_tokens * 7 // 8)
    erased = texts[:victim] + texts[victim + 1 :]
    rebuilt, erase_s = timed(lambda: backend.compile(erased, blocks={k: v for k, v in store.items()}.get))
    never, never_s = timed(lambda: backend.compile(erased))
    report["erase"] = {
        "victim_position": positions[victim], "scope_tokens": base.header.num_tokens,
        "rebuild_s": round(erase_s, 3), "rebuild_model_s": rebuilt.stats["compute_s"], "full_compile_s": round(never_s, 3),
        "time_ratio": round(erase_s / never_s, 4), "blocks_reused": rebuilt.stats["blocks_reused"],
        "byte_identical_to_never_had_it": backend.dump_parts(rebuilt).digest == backend.dump_parts(never).digest,
    }
    # a memory in the middle of the last eighth (the figure above is the worst case: the first memory of that eighth,
    # whose rebuild starts at the block holding position 7/8 of the scope); its rebuild vs the same full compile time
    middle = next(i for i, p in enumerate(positions) if p >= base.header.num_tokens * 15 // 16)
    rebuilt_mid, mid_s = timed(lambda: backend.compile(texts[:middle] + texts[middle + 1 :], blocks=store.get))
    report["erase"]["middle_of_last_eighth"] = {
        "victim_position": positions[middle], "rebuild_s": round(mid_s, 3), "rebuild_model_s": rebuilt_mid.stats["compute_s"],
        "time_ratio": round(mid_s / never_s, 4), "blocks_reused": rebuilt_mid.stats["blocks_reused"],
    }
    print(json.dumps({"erase": report["erase"]}), flush=True)

    return report


def _storage(backend, rng, args, report):
    """Storage over 50 appends, every version stored by parts, each block once; also under retention K."""
    if "storage" not in args.parts:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2) + "\n")
        return
    grow = memories_for(backend, rng, args.grow_from, start=20_000)
    stored: dict[str, int] = {}
    blocks: dict[str, bytes] = {}
    tails, versions, identical, checks, inc_times = 0, [], True, 0, []
    history: list[tuple[list[str], int]] = []  # per version: its block ids and its tail's bytes
    for step in range(args.appends + 1):
        if step:
            grow.append(memory(rng, 30_000 + step))
        cartridge, seconds = timed(lambda: backend.compile(grow, blocks=blocks.get))
        inc_times.append(seconds)
        version = backend.dump_parts(cartridge)
        for ref, data in version.blocks:
            blocks.setdefault(ref.block_id, data)
            stored.setdefault(ref.block_id, len(data))
        tails += len(version.tail)
        versions.append(version.size_bytes)
        history.append(([ref.block_id for ref, _ in version.blocks], len(version.tail)))
        if step % 25 == 0:
            checks += 1
            identical &= version.digest == backend.dump_parts(backend.compile(grow)).digest
    total = sum(stored.values()) + tails
    report["storage"] = {
        "appends": args.appends, "first_tokens": backend.count_tokens(grow[: len(grow) - args.appends]), "last_tokens": cartridge.header.num_tokens,
        "stored_bytes": total, "largest_version_bytes": max(versions), "ratio_to_largest": round(total / max(versions), 4),
        "whole_blobs_bytes": sum(versions), "whole_blobs_ratio": round(sum(versions) / max(versions), 2),
        "incremental_compile_s_p50": round(sorted(inc_times[1:])[len(inc_times[1:]) // 2], 3),
        "identity_checks": checks, "byte_identical_to_scratch": identical,
        "tail_bytes_total": tails, "block_bytes_total": sum(stored.values()),
    }
    # under retention (services/retention.py): the newest version and the K before it keep their tail and blocks
    for keep in [int(k) for k in args.keep.split(",") if k]:
        kept = history[-(keep + 1):]
        kept_blocks = {block for ids, _ in kept for block in ids}
        total_kept = sum(stored[b] for b in kept_blocks) + sum(tail for _, tail in kept)
        report["storage"][f"keep_previous_versions={keep}"] = {"stored_bytes": total_kept, "ratio_to_largest": round(total_kept / max(versions), 4)}
    print(json.dumps({"storage": report["storage"]}), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
