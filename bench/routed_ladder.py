#!/usr/bin/env python
"""The routed repair ladder on LoCoMo: each repair rung against re-reading the same retrieved memories.

For each question (categories 1-4 of the development split), BM25 (kvengine.retrieval) picks the top ``k`` turns
of its conversation, in log order; each turn is one memory "[<session date>] <speaker>: <text>", compiled once
into a chunk (kvengine.routed, not timed). The reference re-reads P + those chunks' ids + the question in one
prefill (answer_reread). Per rung (none, first-4/8/16, deviation-5/15%, full; and "@q8": the same over chunks
stored in q8 and read back) it reports: first token same as the reference, mean first-token and all-position KL
(teacher-forced along the reference's answer), whole answers identical to the reference (free greedy decoding),
token F1 against the gold answer (kvengine.kveval.metrics), TTFT p50/p95 (assembly + repair + question prefill,
chunks in memory), and tokens recomputed. A rung "holds" at identical >= 90% and mean
first-token KL <= 0.02. Results are rewritten after every question, so a stopped run keeps what it measured.
LoCoMo (CC BY-NC) is read from --data, never copied into the repository; results hold numbers only.

Example: OMP_NUM_THREADS=1 .venv/bin/python bench/routed_ladder.py --questions 150 --out bench/results/routed_ladder.json
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DEFAULT_DATA = ROOT.parent.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
DEFAULT_RUNGS = "none,first-4,first-8,first-16,deviation-5,deviation-15,full,deviation-15@q8"
HOLDS = {"identical": 0.90, "first_token_mean_kl": 0.02}  # the targets a rung has to meet to hold


def load_locomo(path: Path) -> list[dict]:
    """Conversations as {"id", "memories": [text], "dia_ids": [id], "questions": [{question, answer, category, evidence}]}."""
    out = []
    for sample in json.loads(path.read_text()):
        conv = sample["conversation"]
        sessions = sorted((int(key.split("_")[1]), key) for key in conv if key.startswith("session_") and key.count("_") == 1)
        memories, dia_ids = [], []
        for _, key in sessions:
            date = conv.get(f"{key}_date_time", "")
            for turn in conv[key]:
                memories.append(f"[{date}] {turn['speaker']}: {turn['text']}")
                dia_ids.append(turn.get("dia_id", ""))
        questions = [
            {"index": index, "question": qa["question"], "answer": str(qa["answer"]), "category": int(qa["category"]),
             "evidence": list(qa.get("evidence") or [])}
            for index, qa in enumerate(sample["qa"]) if int(qa.get("category", 5)) in (1, 2, 3, 4) and "answer" in qa
        ]
        out.append({"id": sample.get("sample_id", str(len(out))), "memories": memories, "dia_ids": dia_ids, "questions": questions})
    return out


def policy_of(rung: str):
    """A rung name ("first-8", "deviation-15", "full@q8") as (RepairPolicy, chunk quant)."""
    from kvengine.routed import RepairPolicy

    name, _, quant = rung.partition("@")
    kind, _, arg = name.partition("-")
    policy = {"none": RepairPolicy.none, "full": RepairPolicy.full}.get(kind)
    if policy is not None:
        return policy(), quant or "none"
    if kind == "first":
        return RepairPolicy.first(int(arg)), quant or "none"
    if kind == "deviation":
        return RepairPolicy.deviation(float(arg) / 100), quant or "none"
    raise SystemExit(f"unknown rung {rung!r}")


def pick_questions(conversations: list[dict], n: int) -> list[tuple[dict, dict]]:
    """``n`` questions spread evenly over the conversations, each in its file order."""
    per = math.ceil(n / len(conversations))
    picked = [(conv, qa) for conv in conversations for qa in conv["questions"][:per]]
    return picked[:n]


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def summarize(rows: list[dict], rungs: list[str]) -> dict:
    def mean(values):
        return sum(values) / len(values) if values else None

    out = {"reference": {
        "f1": mean([r["reference"]["f1"] for r in rows]), "ttft_p50_s": quantile([r["reference"]["ttft_s"] for r in rows], 0.5),
        "ttft_p95_s": quantile([r["reference"]["ttft_s"] for r in rows], 0.95), "evidence_recall": mean([r["evidence_recall"] for r in rows]),
    }}
    for rung in rungs:
        got = [r["rungs"][rung] for r in rows if rung in r["rungs"]]
        entry = {
            "num_questions": len(got), "first_token_same": mean([g["first_token_same"] for g in got]),
            "first_token_mean_kl": mean([g["first_token_kl"] for g in got]), "mean_kl": mean([g["mean_kl"] for g in got]),
            "top1_per_position": mean([g["top1_per_position"] for g in got]), "identical": mean([g["identical"] for g in got]),
            "f1": mean([g["f1"] for g in got]), "ttft_p50_s": quantile([g["ttft_s"] for g in got], 0.5),
            "ttft_p95_s": quantile([g["ttft_s"] for g in got], 0.95), "recomputed_tokens_mean": mean([g["num_recomputed"] for g in got]),
        }
        entry["holds"] = bool(got) and entry["identical"] >= HOLDS["identical"] and entry["first_token_mean_kl"] <= HOLDS["first_token_mean_kl"]
        out[rung] = entry
    categories = sorted({r["category"] for r in rows})
    out["f1_by_category"] = {
        str(c): {"n": sum(r["category"] == c for r in rows), "reference": mean([r["reference"]["f1"] for r in rows if r["category"] == c]),
                 **{rung: mean([r["rungs"][rung]["f1"] for r in rows if r["category"] == c and rung in r["rungs"]]) for rung in rungs}}
        for c in categories
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo development split (locomo_dev.json)")
    parser.add_argument("--questions", type=int, default=150, help="questions of categories 1-4, spread over the conversations")
    parser.add_argument("--k", type=int, default=5, help="memories retrieved per question (BM25 top k, log order)")
    parser.add_argument("--answer-tokens", type=int, default=16, help="greedy answer length")
    parser.add_argument("--rungs", default=DEFAULT_RUNGS, help="comma-separated: none, first-N, deviation-P, full; '@q8' for q8-stored chunks")
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th picked question from the i-th (merge with --merge)")
    parser.add_argument("--merge", type=Path, nargs="+", help="merge these shard results into --out instead of running")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: a shared machine's spinning OpenMP threads cost 10x)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "routed_ladder.json", help="results JSON")
    args = parser.parse_args(argv)

    if args.merge:
        parts = [json.loads(path.read_text()) for path in args.merge]
        rows = [row for part in parts for row in part["questions"]]
        merged = {**parts[0], "command": [part["command"] for part in parts], "num_questions": len(rows),
                  "elapsed_s": max(part["elapsed_s"] for part in parts), "summary": summarize(rows, parts[0]["rungs"]), "questions": rows,
                  "ids_are_layout": sum(r["ids_are_layout"] for r in rows) / len(rows)}
        args.out.write_text(json.dumps(merged, indent=1))
        print(json.dumps({k: v for k, v in merged["summary"].items()}, indent=1))
        return 0
    import torch
    from kv_speed import machine_info

    from kvengine import make_backend
    from kvengine.kveval.metrics import f1
    from kvengine.retrieval import Bm25
    from kvengine.routed import (
        answer_reread,
        answer_routed,
        check_chunk_ids,
        chunk_dumps,
        chunk_loads,
        compile_chunk,
        divergence_of,
        reread_logprobs,
        routed_logprobs,
    )

    torch.set_num_threads(args.threads)
    rungs = [r.strip() for r in args.rungs.split(",") if r.strip()]
    policies = {rung: policy_of(rung) for rung in rungs}
    backend = make_backend("transformers", dtype="f32", quant="none", device="cpu")
    conversations = load_locomo(args.data)
    shard, num_shards = (int(x) for x in args.shard.split("/"))
    picked = pick_questions(conversations, args.questions)[shard::num_shards]
    indexes = {conv["id"]: Bm25(conv["memories"]) for conv in conversations}
    compiled: dict[tuple[str, int], dict] = {}  # (conversation, turn) -> {"none": chunk, "q8": chunk, bytes...}

    def chunk_of(conv: dict, index: int) -> dict:
        key = (conv["id"], index)
        if key not in compiled:
            chunk = compile_chunk(backend, conv["memories"][index])
            whole, q8 = chunk_dumps(chunk), chunk_dumps(chunk, quant="q8")
            compiled[key] = {"none": chunk, "q8": chunk_loads(q8), "tokens": chunk.num_tokens, "f32_bytes": len(whole), "q8_bytes": len(q8)}
        return compiled[key]

    rows: list[dict] = []
    started = time.perf_counter()
    for number, (conv, qa) in enumerate(picked, 1):
        question = qa["question"]
        chosen = indexes[conv["id"]].top_k(question, args.k)  # log order
        entries = [chunk_of(conv, i) for i in chosen]
        chunks = {quant: [e[quant] for e in entries] for quant in ("none", "q8")}
        reference = answer_reread(backend, chunks["none"], question, max_new_tokens=args.answer_tokens)
        logp_ref = reread_logprobs(backend, chunks["none"], question, reference.token_ids)
        evidence = set(qa["evidence"])
        row = {
            "conversation": conv["id"], "qa_index": qa["index"], "category": qa["category"],
            "retrieved": [conv["dia_ids"][i] for i in chosen],
            "evidence_recall": (len(evidence & {conv["dia_ids"][i] for i in chosen}) / len(evidence)) if evidence else 0.0,
            "ids_are_layout": check_chunk_ids(backend.layout, [conv["memories"][i] for i in chosen], question),
            "reference": {"f1": f1(reference.text, qa["answer"]), "ttft_s": reference.ttft_s, "num_answer_tokens": len(reference.token_ids)},
            "rungs": {},
        }
        for rung in rungs:
            policy, quant = policies[rung]
            logp = routed_logprobs(backend, chunks[quant], question, reference.token_ids, repair=policy)
            div = divergence_of(backend, logp_ref, logp, reference.token_ids, args.answer_tokens)
            # greedy decoding reproduces the reference when every teacher-forced argmax is its next token (and an end
            # where it stopped): then only the first token is decoded here, for the time to it
            answer = answer_routed(backend, chunks[quant], question, repair=policy, max_new_tokens=1 if div.identical else args.answer_tokens)
            text = reference.text if div.identical else answer.text
            row["rungs"][rung] = {
                "f1": f1(text, qa["answer"]), "identical": div.identical or answer.token_ids == reference.token_ids,
                "first_token_same": div.top1[0], "first_token_kl": div.kls[0], "mean_kl": sum(div.kls) / len(div.kls),
                "top1_per_position": sum(div.top1) / len(div.top1), "ttft_s": answer.ttft_s, "num_recomputed": answer.num_recomputed_tokens,
            }
        rows.append(row)
        sizes = list(compiled.values())
        result = {
            "bench": "routed_ladder", "command": " ".join(["bench/routed_ladder.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": machine_info(), "data": args.data.name, "k": args.k, "answer_tokens": args.answer_tokens, "rungs": rungs,
            "holds_if": HOLDS, "num_questions": len(rows), "elapsed_s": time.perf_counter() - started,
            "ids_are_layout": sum(r["ids_are_layout"] for r in rows) / len(rows),
            "chunks": {
                "num": len(sizes), "tokens_mean": statistics.mean(s["tokens"] for s in sizes),
                "f32_bytes_per_token": sum(s["f32_bytes"] for s in sizes) / sum(s["tokens"] for s in sizes),
                "q8_bytes_per_token": sum(s["q8_bytes"] for s in sizes) / sum(s["tokens"] for s in sizes),
            },
            "summary": summarize(rows, rungs), "questions": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"{number}/{len(picked)} {time.perf_counter() - started:.0f}s", flush=True)
    summary = result["summary"]
    for rung in rungs:
        s = summary[rung]
        print(f"{rung:18s} first={s['first_token_same']:.2f} kl1={s['first_token_mean_kl']:.4f} identical={s['identical']:.2f} "
              f"f1={s['f1']:.3f} ttft50={s['ttft_p50_s']:.3f} holds={s['holds']}")
    print(f"reference f1={summary['reference']['f1']:.3f} ttft50={summary['reference']['ttft_p50_s']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
