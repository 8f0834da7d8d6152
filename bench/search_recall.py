#!/usr/bin/env python
"""Recall of the product's search on LoCoMo: evidence recall@3/5/10 of memory_search, BM25 alone and hybrid.

    createdb -h 127.0.0.1 -U postgres mnesio_search_recall
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/mnesio_search_recall MNESIO_DEBUG=1 OMP_NUM_THREADS=1 \\
      .venv/bin/python bench/search_recall.py --conversations conv-26,conv-30

Each conversation of the development split becomes a new scope, one memory per turn as kveval loads it
(kvengine.kveval.locomo: ``[<session date>] <speaker>: <text>``), appended through memories_append_batch (sealed
and indexed like any append). Every question with evidence is searched through memories.selectors.memory_search
(k = 10) with ``retriever="bm25"`` (the search index: stemmed BM25) and ``retriever="hybrid"`` (that, fused by
reciprocal rank with all-MiniLM-L6-v2 similarity); an evidence turn counts at k when it is among the first k hits.
Beside them, kveval's rankings of the same turns (kvengine.kveval.retrieval: unstemmed bm25s, and its hybrid), so
the effect of stemming shows apart from the fusion's. Recall is kveval's (locomo_runner.summarize_recall).
LoCoMo is evaluation data (CC BY-NC): read from --data, never copied; the results hold ids and numbers only.
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
KS = (3, 5, 10)
PRODUCT = ("bm25", "hybrid")  # memory_search's retrievers
KVEVAL = ("bm25", "hybrid")  # kveval's, over the same turns


def _default_data() -> Path:
    for base in (ROOT.parent, ROOT.parent.parent):  # /work/main -> /work/shared; a worktree /work/wt/x too
        path = base / "shared" / "data" / "locomo" / "locomo_dev.json"
        if path.exists():
            return path
    return ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"


def run(*, data: Path, conversations: list[str]) -> dict:
    from kvengine.kveval.locomo import load_locomo
    from kvengine.kveval.locomo_runner import evidence_ranks, summarize_recall
    from kvengine.kveval.retrieval import Retrievers
    from memories import search_dense
    from memories.selectors import memory_search
    from memories.services import memories_append_batch, scope_create

    loaded = load_locomo(data, conversations=conversations)
    encoder = search_dense.encoder()  # one model for the product's hybrid and kveval's
    rows: list[dict] = []
    seconds: dict[str, list[float]] = {name: [] for name in PRODUCT}
    per_conversation = []
    for conversation in loaded.conversations:
        scope = scope_create(name=f"locomo-{conversation.sample_id}-{uuid.uuid4().hex[:8]}")
        started = time.perf_counter()
        seqs = []
        for start in range(0, len(conversation.memories), 1000):
            items = [{"content": text} for text in conversation.memories[start:start + 1000]]
            seqs += [o.memory.seq for o in memories_append_batch(scope=scope, items=items)]
        fill_s = time.perf_counter() - started
        kveval_rows = {row["qid"]: row for row in evidence_ranks(conversation, Retrievers(conversation.memories, encoder),
                                                                  KVEVAL)}
        embed_s = None
        for question in conversation.questions:
            if not question.evidence:
                continue
            row = {"qid": question.qid, "category": question.category, "ranks": {}}
            for name in PRODUCT:
                started = time.perf_counter()
                hits = [r.seq for r in memory_search(scope=scope, query=question.question, k=max(KS), retriever=name)]
                took = time.perf_counter() - started
                if name == "hybrid" and embed_s is None:
                    embed_s = took  # the first hybrid search embeds the scope in this process
                else:
                    seconds[name].append(took)
                position = {seq: rank for rank, seq in enumerate(hits, start=1)}
                # an evidence turn outside the first max(KS) hits is past every k measured
                row["ranks"][f"product_{name}"] = [position.get(seqs[i], max(KS) + 1) for i in question.evidence]
            for name in KVEVAL:
                row["ranks"][f"kveval_{name}"] = kveval_rows[question.qid]["ranks"][name]
            rows.append(row)
        per_conversation.append({"sample_id": conversation.sample_id, "num_memories": len(seqs),
                                 "num_questions": sum(1 for q in conversation.questions if q.evidence),
                                 "fill_s": round(fill_s, 2), "first_hybrid_search_s": round(embed_s or 0.0, 2)})
    names = [f"product_{n}" for n in PRODUCT] + [f"kveval_{n}" for n in KVEVAL]
    return {
        "conversations": per_conversation,
        "recall": summarize_recall(rows, names, KS),
        "search_ms_p50": {name: round(1000 * statistics.median(values), 1) for name, values in seconds.items() if values},
        "records": [{"qid": r["qid"], "category": r["category"], "ranks": r["ranks"]} for r in rows],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--data", type=Path, default=_default_data(), help="LoCoMo's development split (JSON)")
    parser.add_argument("--conversations", default="conv-26", help="sample_ids, comma-separated (default conv-26)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/search_recall.json")
    parser.add_argument("--no-migrate", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
    os.environ.setdefault("MNESIO_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    if not settings.MNESIO_WEB_LOADS_MODEL:
        sys.exit("search_recall measures the hybrid retriever: unset MNESIO_WEB_LOADS_MODEL=false")
    if not args.no_migrate:
        call_command("migrate", interactive=False, verbosity=0)
    started = time.perf_counter()
    figures = run(data=args.data, conversations=[c for c in args.conversations.split(",") if c])
    figures["total_s"] = round(time.perf_counter() - started, 1)
    figures["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    figures["command"] = " ".join(["bench/search_recall.py", *sys.argv[1:]])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    summary = {name: cell["10"]["all"] for name, cell in figures["recall"].items() if name != "num_questions"}
    print(json.dumps({"recall@10": summary, "search_ms_p50": figures["search_ms_p50"]}, indent=2))


if __name__ == "__main__":
    main()
