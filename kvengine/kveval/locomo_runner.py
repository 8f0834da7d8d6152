"""Run kveval on LoCoMo: evidence recall@k of each retriever, and answers scored per category as the paper does.

A whole conversation is one scope (10k-21k tokens: past the model's window). Recall is measured on every
selected question (no model needed); answers are asked of a seeded subset in the modes that make sense on a
whole conversation: the top-k turns re-read as text (``bm25``, ``dense``, ``hybrid``), no memory at all
(``closed_book``, the floor) and ``cartridge``, the prefix cartridge of the conversation's first window.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvengine import DTYPES
from kvengine.errors import ConfigError

from .locomo import CATEGORIES, LocomoConversation, LocomoData, LocomoQuestion, question_prompt, sample_questions
from .metrics import evidence_recall, locomo_resolve_choice, locomo_score
from .retrieval import RETRIEVERS, DenseEncoder, Retrievers
from .runner import QUESTION_ROOM_TOKENS, BackendPool, Progress, machine_info, median_p95

LOCOMO_MODES = ("bm25", "dense", "hybrid", "closed_book", "cartridge")
SCORED_CATEGORIES = (1, 2, 3, 4)  # token F1; category 5 (adversarial) is an abstention accuracy, reported apart


@dataclass(frozen=True)
class LocomoConfig:
    """What to run on LoCoMo; every field is recorded in the results so the run can be repeated."""

    backend: str = "transformers"  # "fake" runs the pipeline without a model (tests)
    model: str | None = None  # None: the backend's default (SmolLM2-135M-Instruct for transformers)
    dtype: str = "f32"
    device: str = "cpu"
    modes: tuple[str, ...] = ("bm25", "hybrid", "closed_book")  # () measures recall only: no model is loaded
    retrievers: tuple[str, ...] = RETRIEVERS  # whose evidence recall is measured
    recall_ks: tuple[int, ...] = (3, 5, 10)
    top_k: int = 3  # turns re-read per question by the retrieval modes
    questions_per_conversation: int | None = None  # answered per conversation (seeded draw); None: all
    conversations: tuple[str, ...] = ()  # sample_ids; (): every conversation in the file
    categories: tuple[int, ...] = tuple(CATEGORIES)
    max_new_tokens: int = 32
    threads: int | None = None
    seed: int = 0
    question_template: str | None = None  # None: the paper's instructions (locomo.QA_TEMPLATE); else holds {question}

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"`dtype` has to be one of {list(DTYPES)} but got {self.dtype!r}")
        if unknown := [m for m in self.modes if m not in LOCOMO_MODES]:
            raise ConfigError(f"`modes` has to hold values of {list(LOCOMO_MODES)} on LoCoMo but got {unknown}")
        if unknown := [r for r in self.retrievers if r not in RETRIEVERS]:
            raise ConfigError(f"`retrievers` has to hold values of {list(RETRIEVERS)} but got {unknown}")
        if unknown := [c for c in self.categories if c not in CATEGORIES]:
            raise ConfigError(f"`categories` has to hold values of {list(CATEGORIES)} but got {unknown}")
        if not self.recall_ks or any(k < 1 for k in self.recall_ks):
            raise ConfigError(f"`recall_ks` has to hold positive numbers but got {list(self.recall_ks)}")
        if self.top_k < 1:
            raise ConfigError(f"`top_k` has to be at least 1 but got {self.top_k}")
        if self.questions_per_conversation is not None and self.questions_per_conversation < 1:
            raise ConfigError(f"`questions_per_conversation` has to be at least 1 but got {self.questions_per_conversation}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"`max_new_tokens` has to be at least 1 but got {self.max_new_tokens}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"`threads` has to be at least 1 but got {self.threads}")
        if self.question_template is not None and "{question}" not in self.question_template:
            raise ConfigError("`question_template` has to contain '{question}'")

    def needs_dense(self) -> bool:
        return any(name in ("dense", "hybrid") for name in (*self.retrievers, *self.modes))


def evidence_ranks(conversation: LocomoConversation, retrievers: Retrievers, names: Sequence[str]) -> list[dict[str, Any]]:
    """Per question with evidence: the 1-based rank of each evidence memory under each retriever."""
    rows = []
    for question in conversation.questions:
        if not question.evidence:
            continue
        row: dict[str, Any] = {"qid": question.qid, "category": question.category, "ranks": {}}
        for name in names:
            position = {index: rank for rank, index in enumerate(retrievers.ranking(name, question.question), start=1)}
            row["ranks"][name] = [position[index] for index in question.evidence]
        rows.append(row)
    return rows


def recall_at_k(ranks: Sequence[int], k: int) -> float:
    """The fraction of a question's evidence memories ranked within the top ``k`` (ranks are 1-based)."""
    if not ranks:
        raise ValueError("`ranks` has to hold at least one evidence rank but got none")
    return sum(rank <= k for rank in ranks) / len(ranks)


def summarize_recall(rows: Sequence[dict[str, Any]], names: Sequence[str], ks: Sequence[int]) -> dict[str, Any]:
    """Mean recall@k (in %) per retriever and k: over all questions and per category (keys '1'..'5', 'all')."""
    out: dict[str, Any] = {}
    for name in names:
        out[name] = {}
        for k in ks:
            cell: dict[str, Any] = {}
            for label, members in _by_category(rows).items():
                values = [recall_at_k(r["ranks"][name], k) for r in members]
                cell[label] = 100.0 * sum(values) / len(values)
            out[name][str(k)] = cell
    out["num_questions"] = {label: len(members) for label, members in _by_category(rows).items()}
    return out


def _by_category(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {"all": list(rows)}
    for category in sorted({r["category"] for r in rows}):
        groups[str(category)] = [r for r in rows if r["category"] == category]
    return groups


def summarize_answers(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One mode's figures: F1 (%) per category 1-4 and over them, category 5's accuracy (%) apart, latency."""
    scored = [r for r in records if r["category"] in SCORED_CATEGORIES]
    adversarial = [r for r in records if r["category"] == 5]
    per_category = {}
    for category in SCORED_CATEGORIES:
        rows = [r for r in scored if r["category"] == category]
        per_category[str(category)] = 100.0 * sum(r["score"] for r in rows) / len(rows) if rows else None
    recalls = [r["evidence_recall"] for r in records if r.get("evidence_recall") is not None]
    return {
        "num_questions": len(records),
        "num_by_category": {str(c): sum(r["category"] == c for r in records) for c in CATEGORIES},
        "f1_by_category": per_category,
        "f1_1_4": 100.0 * sum(r["score"] for r in scored) / len(scored) if scored else None,
        "adversarial_accuracy": 100.0 * sum(r["score"] for r in adversarial) / len(adversarial) if adversarial else None,
        "evidence_recall": 100.0 * sum(recalls) / len(recalls) if recalls else None,
        "ttft_s": median_p95([r["ttft_s"] for r in records]),
        "total_s": median_p95([r["total_s"] for r in records]),
        "mean_prompt_tokens": sum(r["num_prompt_tokens"] for r in records) / len(records) if records else None,
    }


def first_window(count_tokens: Callable[[Sequence[str]], int], memories: Sequence[str], budget: int) -> int:
    """How many of the first memories fit ``budget`` tokens (token counts grow with the prefix: binary search)."""
    low, high = 0, len(memories)
    while low < high:
        mid = (low + high + 1) // 2
        if count_tokens(memories[:mid]) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def run_locomo(config: LocomoConfig, data: LocomoData, *, pool: BackendPool | None = None,
               encoder: DenseEncoder | None = None, progress: bool = True,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure recall on every selected question and answer the sampled ones in every mode; return the results."""
    if config.threads is not None:
        import torch

        torch.set_num_threads(config.threads)  # on a shared machine, one thread per process avoids OpenMP stalls
    started = time.time()
    modes = list(config.modes)
    main = None
    results: dict[str, Any] = {"dataset": "locomo", "machine": machine_info(), "backend": {},
                               "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}
    if modes:
        pool = pool or BackendPool(config)  # type: ignore[arg-type]  # reads backend/model/dtype/device only
        main = pool.get(config.dtype, "none")
        if "closed_book" in modes and not hasattr(main, "answer_without_memory"):
            log(f"the {config.backend} backend cannot answer without memories; skipping the closed_book mode")
            modes.remove("closed_book")
        results["backend"] = main.describe().as_dict()
    if config.needs_dense() and encoder is None:
        start = time.perf_counter()
        encoder = DenseEncoder(device=config.device)
        results["dense_load_s"] = round(time.perf_counter() - start, 3)
    rank_rows: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    conversations = []
    for conversation in data.conversations:
        retrievers = Retrievers(conversation.memories, encoder)
        rank_rows += evidence_ranks(conversation, retrievers, config.retrievers)
        asked = sample_questions(conversation, config.questions_per_conversation, seed=config.seed)
        row: dict[str, Any] = {"sample_id": conversation.sample_id, "num_memories": len(conversation.memories),
                               "num_questions": len(conversation.questions), "num_asked": len(asked) if modes else 0}
        if main is not None:
            row["num_tokens"] = main.count_tokens(list(conversation.memories))
            log(f"{conversation.sample_id}: {len(conversation.memories)} memories, {row['num_tokens']} tokens, "
                f"{len(asked)} question(s) asked")
            records += _answer_conversation(config, modes, main, conversation, retrievers, asked, row,
                                            progress=progress)
        conversations.append(row)
    results["config"] = {**asdict(config), "modes": modes}
    results["data"] = {"num_conversations": len(data.conversations), "num_questions": data.num_questions,
                       "oddities": data.oddities, "conversations": conversations}
    results["recall"] = summarize_recall(rank_rows, config.retrievers, config.recall_ks)
    results["summary"] = {mode: summarize_answers([r for r in records if r["mode"] == mode]) for mode in modes}
    results["records"] = records
    results["recall_records"] = rank_rows
    results["wall_s"] = round(time.time() - started, 1)
    return results


def _answer_conversation(config: LocomoConfig, modes: Sequence[str], main: Any, conversation: LocomoConversation,
                         retrievers: Retrievers, asked: Sequence[LocomoQuestion], row: dict[str, Any], *,
                         progress: bool) -> list[dict[str, Any]]:
    memories = list(conversation.memories)
    cartridge = None
    window = 0
    prompts = {q.qid: question_prompt(q, seed=config.seed, template=config.question_template) for q in asked}
    if "cartridge" in modes:
        # room for the longest question turn (the paper's instructions make it longer than SQuAD's) and the answer
        longest = max((main.count_tokens([prompt]) for prompt, _ in prompts.values()), default=0)
        room = main.describe().max_context_tokens - config.max_new_tokens - max(QUESTION_ROOM_TOKENS, longest + 32)
        window = first_window(main.count_tokens, memories, room)
        start = time.perf_counter()
        cartridge = main.compile(memories[:window], labels={"eval": "kveval-locomo", "conversation": conversation.sample_id})
        row["cartridge"] = {"num_memories": window, "num_tokens": main.count_tokens(memories[:window]),
                            "compile_s": round(time.perf_counter() - start, 3)}
    records = []
    bar = Progress(len(asked), conversation.sample_id, progress)
    for question in asked:
        prompt, options = prompts[question.qid]
        base = {"qid": question.qid, "conversation": conversation.sample_id, "category": question.category,
                "question": question.question, "prompt": prompt, "answer": question.answer,
                "evidence": list(question.evidence)}
        for mode in modes:
            retrieval_s = 0.0
            retrieved: list[int] | None = None
            if mode == "closed_book":
                answer = main.answer_without_memory(prompt, max_new_tokens=config.max_new_tokens)
            elif mode == "cartridge":
                answer = main.answer(cartridge, prompt, max_new_tokens=config.max_new_tokens)
                retrieved = list(range(window))
            else:
                start = time.perf_counter()
                retrieved = sorted(retrievers.ranking(mode, question.question)[:config.top_k])  # re-read in log order
                retrieval_s = time.perf_counter() - start
                answer = main.answer_from_text([memories[i] for i in retrieved], prompt,
                                               max_new_tokens=config.max_new_tokens)
            scored_text = locomo_resolve_choice(answer.text, options) if options else answer.text
            record = {**base, "mode": mode, "prediction": answer.text, "scored_text": scored_text,
                      "score": locomo_score(scored_text, question.answer, question.category),
                      "retrieval_s": retrieval_s, "ttft_s": retrieval_s + answer.ttft_s,
                      "total_s": retrieval_s + answer.total_s, "num_prompt_tokens": answer.num_prompt_tokens}
            if retrieved is not None:
                record["evidence_recall"] = evidence_recall(retrieved, question.evidence)
                if mode != "cartridge":
                    record["retrieved"] = retrieved
            records.append(record)
        bar.update()
    bar.close()
    return records
