"""Run the eval: the same questions, same model, greedy decoding, answered four ways per budget.

Modes: ``cartridge`` (the scope compiled once), ``text`` (the scope re-read per question), ``bm25`` and
``dense`` (the top-k paragraphs of the scope for each question, re-read as text). Quantized and bf16
cartridges of the same scopes are compared token for token with the main cartridge.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvengine import DTYPES, QUANTS, KvBackend, make_backend
from kvengine.divergence import AnswerDivergence, DivergenceSummary
from kvengine.errors import ConfigError
from kvengine.retrieval import Bm25

from .data import Article, Question, Scope, build_packed_scopes, build_scopes, sample_questions, scope_articles
from .metrics import squad_scores
from .retrieval import DenseEncoder, DenseIndex

# closed_book: the question with no memories at all (the floor both for accuracy and for latency)
MODES = ("cartridge", "text", "bm25", "dense", "closed_book")
# q8's agreement floor with the f32 cartridge: >= 98% identical answers.
Q8_MIN_AGREEMENT = 0.98
# Each budget's scopes are drawn from at least this many articles, so that a variant's agreement is
# not one article's (q8 had looked better on a single article than it is); checked per budget in the report.
MIN_ARTICLES_PER_BUDGET = 10
# Targets on the divergence measure (kvengine.divergence), checked in the report:
# label -> (max mean KL over all positions, max mean first-token KL, min identical answers, min top-1 per position)
DIVERGENCE_TARGETS: dict[str, dict[str, float]] = {
    "q8": {"max_first_token_mean_kl": 1e-3, "min_identical": 0.98},
    "q4": {"max_mean_kl": 0.02, "min_identical": 0.85},
    "bf16r": {"min_top1_per_position": 0.99, "min_identical": 0.90},
}
# Asked after every question, in every mode alike: SQuAD answers are short spans, and F1 punishes the
# small model's habit of answering in a full sentence.
# Tokens kept free for the question turn when a budget nears the context window (SQuAD questions + the
# template's suffix stay well under this).
QUESTION_ROOM_TOKENS = 96
DEFAULT_QUESTION_TEMPLATE = "{question} Answer with a few words from the memories."


@dataclass(frozen=True)
class EvalConfig:
    """What to run; every field is recorded in the results so the run can be repeated."""

    backend: str = "transformers"  # "fake" runs the pipeline without a model (tests)
    model: str | None = None  # None: the backend's default (SmolLM2-135M-Instruct for transformers)
    dtype: str = "f32"  # the main precision: all four modes use it
    device: str = "cpu"
    quants: tuple[str, ...] = ("q8", "q4")  # extra cartridges compared with the main one, token for token
    compare_dtypes: tuple[str, ...] = ("bf16", "bf16r")  # extra precisions compared the same way
    budgets: tuple[int, ...] = (1024, 2048, 4096, 8192)
    questions: tuple[int, ...] = (12, 8, 6, 6)  # per budget: 8k re-reads cost 20-50 s each on 2 shared cores
    articles: tuple[int, ...] = (2, 1, 1, 1)  # scopes (articles) per budget; an 8k compile per variant is ~40 s
    # the small model restates the question before answering: 16 tokens cut many answers off (an earlier
    # 16-token run, in git history); 32 is also what cartridge_answer uses (MNESIO_ANSWER_MAX_NEW_TOKENS)
    max_new_tokens: int = 32
    threads: int | None = None  # torch intra-op threads; None keeps torch's default (one per core)
    top_k: int = 3  # paragraphs retrieved per question by bm25 and dense
    seed: int = 0
    question_template: str = DEFAULT_QUESTION_TEMPLATE
    modes: tuple[str, ...] = MODES
    # pack several articles into a scope when one is too short, each article used once per budget, so a
    # budget's scopes span as many articles as scopes; False: one article per scope, short ones skipped
    pack_articles: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"`dtype` has to be one of {list(DTYPES)} but got {self.dtype!r}")
        for quant in self.quants:
            if quant not in QUANTS:
                raise ConfigError(f"`quants` has to hold values of {list(QUANTS)} but got {quant!r}")
        for dtype in self.compare_dtypes:
            if dtype not in DTYPES:
                raise ConfigError(f"`compare_dtypes` has to hold values of {list(DTYPES)} but got {dtype!r}")
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or "cartridge" not in self.modes:
            raise ConfigError(f"`modes` has to include 'cartridge' and only values of {list(MODES)} but got {list(self.modes)}")
        if not self.budgets or any(b < 64 for b in self.budgets):
            raise ConfigError(f"`budgets` has to hold token budgets of at least 64 but got {list(self.budgets)}")
        if len(self.questions) not in (1, len(self.budgets)) or any(n < 1 for n in self.questions):
            raise ConfigError(
                f"`questions` has to be one positive number or one per budget ({len(self.budgets)}) "
                f"but got {list(self.questions)}"
            )
        if len(self.articles) not in (1, len(self.budgets)) or any(n < 1 for n in self.articles):
            raise ConfigError(
                f"`articles` has to be one positive number or one per budget ({len(self.budgets)}) "
                f"but got {list(self.articles)}"
            )
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"`threads` has to be at least 1 but got {self.threads}")
        if self.top_k < 1:
            raise ConfigError(f"`top_k` has to be at least 1 but got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"`max_new_tokens` has to be at least 1 but got {self.max_new_tokens}")
        if "{question}" not in self.question_template:
            raise ConfigError("`question_template` has to contain '{question}'")

    def questions_for(self, budget_index: int) -> int:
        return self.questions[0] if len(self.questions) == 1 else self.questions[budget_index]

    def articles_for(self, budget_index: int) -> int:
        return self.articles[0] if len(self.articles) == 1 else self.articles[budget_index]

    def variants(self) -> list[tuple[str, str, str]]:
        """(label, dtype, quant) of every cartridge compared with the main one."""
        out = [(q, self.dtype, q) for q in self.quants if q != "none"]
        out += [(d, d, "none") for d in self.compare_dtypes if d != self.dtype]
        return out


class BackendPool:
    """One backend per (dtype, quant), built on first use and kept (model loads are the slow part)."""

    def __init__(self, config: EvalConfig, factory: Callable[..., KvBackend] = make_backend):
        self.config = config
        self.factory = factory
        self._backends: dict[tuple[str, str], KvBackend] = {}
        self.load_s: dict[str, float] = {}

    def get(self, dtype: str, quant: str) -> KvBackend:
        key = (dtype, quant)
        if key not in self._backends:
            start = time.perf_counter()
            main_key = (self.config.dtype, "none")
            main = self._backends.get(main_key)
            # a variant shares the main backend's weights (or casts a copy): no second model load
            variant = main.variant(dtype=dtype, quant=quant) if main is not None else None
            if variant is not None:
                self._backends[key] = variant
            else:
                options: dict[str, Any] = {"dtype": dtype, "quant": quant, "device": self.config.device}
                if self.config.model:
                    options["model"] = self.config.model
                self._backends[key] = self.factory(self.config.backend, **options)
            self.load_s[f"{dtype}/{quant}"] = round(time.perf_counter() - start, 3)
        return self._backends[key]


@dataclass(frozen=True)
class _Titled:
    article: str


def median_p95(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p95": None}
    ordered = sorted(values)
    # nearest-rank p95: with 10-40 samples per cell an interpolated percentile would only pretend precision
    rank = max(1, -(-95 * len(ordered) // 100))
    return {"median": statistics.median(ordered), "p95": ordered[rank - 1]}


def summarize_mode(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """EM/F1 means (in %) and TTFT/end-to-end median and p95 (seconds) over question records of one mode."""
    n = len(records)
    return {
        "num_questions": n,
        "em": 100.0 * sum(r["em"] for r in records) / n if n else None,
        "f1": 100.0 * sum(r["f1"] for r in records) / n if n else None,
        "ttft_s": median_p95([r["ttft_s"] for r in records]),
        "total_s": median_p95([r["total_s"] for r in records]),
        "mean_prompt_tokens": sum(r["num_prompt_tokens"] for r in records) / n if n else None,
        "gold_recall": (sum(r["gold_retrieved"] for r in records) / n
                        if n and all("gold_retrieved" in r for r in records) else None),
    }


def token_agreement(reference: Sequence[int], other: Sequence[int]) -> float:
    """Fraction of positions (over the longer answer) where two greedy answers have the same token."""
    length = max(len(reference), len(other))
    if length == 0:
        return 1.0
    return sum(a == b for a, b in zip(reference, other, strict=False)) / length


@dataclass
class EvalRun:
    """Everything one run measured; ``as_dict`` is the JSON written by report.py."""

    config: EvalConfig
    machine: dict[str, Any]
    backend_description: dict[str, Any] = field(default_factory=dict)
    budgets: list[dict[str, Any]] = field(default_factory=list)
    load_s: dict[str, float] = field(default_factory=dict)
    dense_load_s: float | None = None
    started_at: str = ""
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "machine": self.machine,
            "backend": self.backend_description,
            "started_at": self.started_at,
            "wall_s": self.wall_s,
            "load_s": self.load_s,
            "dense_load_s": self.dense_load_s,
            "budgets": self.budgets,
            "checks": checks(self.budgets),
        }


def machine_info() -> dict[str, Any]:
    """The machine the figures come from (CPU, cores, load, library versions)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_name(),
        "num_cpus": os.cpu_count(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class Progress:
    """A tqdm bar when tqdm is installed and wanted, else nothing."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="q", dynamic_ncols=True)

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_eval(config: EvalConfig, articles: Sequence[Article], *, pool: BackendPool | None = None,
             encoder: DenseEncoder | None = None, progress: bool = True,
             log: Callable[[str], None] = print) -> EvalRun:
    """Answer each budget's questions in every mode and compare the variant cartridges."""
    if config.threads is not None:
        import torch

        # on a shared machine, one thread per process avoids OpenMP barrier stalls between busy cores
        torch.set_num_threads(config.threads)
    pool = pool or BackendPool(config)
    started = time.time()
    run = EvalRun(config=config, machine=machine_info(),
                  started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)))
    main = pool.get(config.dtype, "none")
    if "closed_book" in config.modes and not hasattr(main, "answer_without_memory"):
        log(f"the {config.backend} backend cannot answer without memories; skipping the closed_book mode")
        config = dataclasses.replace(config, modes=tuple(m for m in config.modes if m != "closed_book"))
        run.config = config
    run.backend_description = main.describe().as_dict()
    if "dense" in config.modes and encoder is None:
        start = time.perf_counter()
        encoder = DenseEncoder(device=config.device)
        run.dense_load_s = round(time.perf_counter() - start, 3)
    # an 8k budget on an 8k model must still leave room for the question and the answer
    room = main.describe().max_context_tokens - config.max_new_tokens - QUESTION_ROOM_TOKENS
    for budget_index, budget in enumerate(config.budgets):
        num_questions = config.questions_for(budget_index)
        if budget > room:
            log(f"budget {budget}: packing to {room} tokens so the question and the answer fit the context window")
        scopes = None
        if config.pack_articles:
            try:
                scopes = build_packed_scopes(articles, min(budget, room), main.count_tokens,
                                             num_scopes=config.articles_for(budget_index))
            except ValueError:
                scopes = None  # paragraphs too long to pack for this budget: one article per scope, as before
        if scopes is None:
            scopes = build_scopes(articles, min(budget, room), main.count_tokens,
                                  num_articles=config.articles_for(budget_index))
        picked = sample_questions(scopes, num_questions, seed=config.seed + budget)
        log(f"budget {budget}: {len(scopes)} scope(s) "
            f"({', '.join(f'{s.article} {s.num_tokens} tok/{len(s.paragraphs)} para' for s in scopes)}), "
            f"{len(picked)} question(s)")
        run.budgets.append(run_budget(config, pool, encoder, budget, scopes, picked, progress=progress))
        run.load_s = dict(pool.load_s)
    run.wall_s = round(time.time() - started, 1)
    return run


def run_budget(config: EvalConfig, pool: BackendPool, encoder: DenseEncoder | None, budget: int,
               scopes: Sequence[Scope], picked: Sequence[tuple[Scope, Question]], *,
               progress: bool) -> dict[str, Any]:
    """One budget: compile each scope, answer its questions in every mode, compare the variants."""
    main = pool.get(config.dtype, "none")
    main_label = config.dtype
    load_before = _load()
    records: list[dict[str, Any]] = []
    scope_rows: list[dict[str, Any]] = []
    agreement_rows: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in config.variants()}
    bar = Progress(len(picked), f"{budget:>5} tok", progress)
    for scope in scopes:
        questions = [q for s, q in picked if s is scope]
        if not questions:
            continue
        texts = list(scope.paragraphs)
        start = time.perf_counter()
        cartridge = main.compile(texts, labels={"eval": "kveval", "article": scope.article})
        compile_s = time.perf_counter() - start
        sizes = {main_label: len(main.dumps(cartridge))}
        compile_times = {main_label: round(compile_s, 3)}
        bm25 = Bm25(texts) if "bm25" in config.modes else None
        dense_index_s = None
        dense = None
        if "dense" in config.modes:
            assert encoder is not None  # run_eval loads it whenever dense is a mode
            start = time.perf_counter()
            dense = DenseIndex(encoder, texts)
            dense_index_s = round(time.perf_counter() - start, 3)
        main_answers: dict[str, tuple[int, ...]] = {}
        main_logprobs: dict[str, Any] = {}  # qid -> the main cartridge's teacher-forced log-probs (precision.py)
        for question in questions:
            prompt = config.question_template.format(question=question.question)
            base = {"qid": question.qid, "article": scope.article, "question": question.question,
                    "answers": list(question.answers), "paragraph_index": question.paragraph_index}
            for mode in config.modes:
                retrieval_s = 0.0
                retrieved: list[int] | None = None
                if mode == "cartridge":
                    answer = main.answer(cartridge, prompt, max_new_tokens=config.max_new_tokens)
                    main_answers[question.qid] = answer.token_ids
                    if config.variants() and hasattr(main, "answer_logprobs"):
                        main_logprobs[question.qid] = main.answer_logprobs(cartridge, prompt, answer.token_ids)
                elif mode == "text":
                    answer = main.answer_from_text(texts, prompt, max_new_tokens=config.max_new_tokens)
                elif mode == "closed_book":
                    answer = main.answer_without_memory(prompt, max_new_tokens=config.max_new_tokens)
                else:
                    index = bm25 if mode == "bm25" else dense
                    start = time.perf_counter()
                    retrieved = index.top_k(question.question, min(config.top_k, len(texts)))
                    retrieval_s = time.perf_counter() - start
                    answer = main.answer_from_text([texts[i] for i in retrieved], prompt,
                                                   max_new_tokens=config.max_new_tokens)
                em, f1 = squad_scores(answer.text, question.answers)
                record = {**base, "mode": mode, "prediction": answer.text, "token_ids": list(answer.token_ids),
                          "em": em, "f1": f1, "retrieval_s": retrieval_s,
                          # retrieval sits on the path to the first token, so it counts in both latencies
                          "ttft_s": retrieval_s + answer.ttft_s, "total_s": retrieval_s + answer.total_s,
                          "num_prompt_tokens": answer.num_prompt_tokens,
                          "num_context_tokens": answer.num_context_tokens}
                if retrieved is not None:
                    record["retrieved"] = retrieved
                    record["gold_retrieved"] = question.paragraph_index in retrieved
                records.append(record)
            bar.update()
        for label, dtype, quant in config.variants():
            backend = pool.get(dtype, quant)
            start = time.perf_counter()
            # compiled by the variant backend (it shares the main one's weights): since format 4 a quantized
            # cartridge is prefilled block on block over its own dequantized KV, not converted from the f32 one
            variant = backend.compile(texts, labels={"eval": "kveval", "article": scope.article})
            compile_times[label] = round(time.perf_counter() - start, 3)
            sizes[label] = len(backend.dumps(variant))
            for question in questions:
                prompt = config.question_template.format(question=question.question)
                answer = backend.answer(variant, prompt, max_new_tokens=config.max_new_tokens)
                reference = main_answers[question.qid]
                divergence = None
                if question.qid in main_logprobs and hasattr(backend, "answer_logprobs"):
                    forced = backend.answer_logprobs(variant, prompt, reference)
                    divergence = AnswerDivergence.of(main_logprobs[question.qid], forced,
                                                     identical=tuple(answer.token_ids) == tuple(reference))
                agreement_rows[label].append({
                    "qid": question.qid,
                    "identical": tuple(answer.token_ids) == tuple(reference),
                    "first_token": bool(answer.token_ids and reference and answer.token_ids[0] == reference[0]),
                    "token_agreement": token_agreement(reference, answer.token_ids),
                    "f1": squad_scores(answer.text, question.answers)[1],
                    "ttft_s": answer.ttft_s,
                    # per position of the teacher-forced f32 answer: KL(main || variant) in nats, top-1 agreement
                    "kl": [round(k, 8) for k in divergence.kls] if divergence else None,
                    "top1": divergence.top1 if divergence else None,
                })
        scope_rows.append({"article": scope.article, "num_paragraphs": len(scope.paragraphs),
                           "num_tokens": scope.num_tokens, "num_questions": len(questions),
                           "compile_s": compile_times, "size_bytes": sizes, "dense_index_s": dense_index_s})
    bar.close()
    return summarize_budget(config, budget, scope_rows, records, agreement_rows,
                            load={"before": load_before, "after": _load()})


def divergence_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The divergence measure (precision.DivergenceSummary) over agreement rows that carry it."""
    answers = [AnswerDivergence(kls=r["kl"], top1=r["top1"], identical=r["identical"]) for r in rows if r.get("kl") is not None]
    return DivergenceSummary.of(answers).as_dict() if answers else None


def pooled_divergence(budgets: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per variant label, the divergence measure over every budget's questions together."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for b in budgets:
        for label, label_rows in b.get("agreement_records", {}).items():
            rows.setdefault(label, []).extend(label_rows)
    pooled = {label: divergence_summary(r) for label, r in rows.items()}
    return {label: d for label, d in pooled.items() if d}


def summarize_budget(config: EvalConfig, budget: int, scope_rows: list[dict[str, Any]],
                     records: list[dict[str, Any]], agreement_rows: dict[str, list[dict[str, Any]]],
                     load: dict[str, Any]) -> dict[str, Any]:
    """Aggregate one budget's question records into per-mode figures, parity and variant agreement."""
    by_mode = {mode: [r for r in records if r["mode"] == mode] for mode in config.modes}
    summary = {mode: summarize_mode(rows) for mode, rows in by_mode.items()}
    parity = None
    if "text" in by_mode:
        text_ids = {r["qid"]: r["token_ids"] for r in by_mode["text"]}
        mismatched = [r["qid"] for r in by_mode["cartridge"] if r["token_ids"] != text_ids[r["qid"]]]
        parity = {"num_questions": len(by_mode["cartridge"]), "num_identical": len(by_mode["cartridge"]) - len(mismatched),
                  "mismatched_qids": mismatched}
    agreement = {}
    for label, rows in agreement_rows.items():
        n = len(rows)
        agreement[label] = {
            "num_questions": n,
            "identical": sum(r["identical"] for r in rows) / n if n else None,
            "first_token": sum(r["first_token"] for r in rows) / n if n else None,
            "token_agreement": sum(r["token_agreement"] for r in rows) / n if n else None,
            "f1": 100.0 * sum(r["f1"] for r in rows) / n if n else None,
            "ttft_s": median_p95([r["ttft_s"] for r in rows]),
            "divergence": divergence_summary(rows),
        }
    total_tokens = sum(s["num_tokens"] for s in scope_rows)
    sizes: dict[str, float] = {}
    for s in scope_rows:
        for label, size in s["size_bytes"].items():
            sizes[label] = sizes.get(label, 0) + size
    ttft_ratio = None
    if "text" in summary and summary["text"]["ttft_s"]["median"] and summary["cartridge"]["ttft_s"]["median"]:
        ttft_ratio = summary["text"]["ttft_s"]["median"] / summary["cartridge"]["ttft_s"]["median"]
    return {
        "budget": budget,
        "num_articles": len(scope_articles([_Titled(s["article"]) for s in scope_rows])),
        "scopes": scope_rows,
        "summary": summary,
        "parity": parity,
        "agreement": agreement,
        # bytes per memory token, per cartridge kind, and each kind's size relative to the main precision
        "bytes_per_token": {k: v / total_tokens for k, v in sizes.items()} if total_tokens else {},
        "size_ratio": {k: v / sizes[config.dtype] for k, v in sizes.items()} if sizes.get(config.dtype) else {},
        "ttft_ratio_text_over_cartridge": ttft_ratio,
        "load_avg": load,
        "records": records,
        "agreement_records": agreement_rows,
    }


def checks(budgets: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The "Must show" checks, computed from the figures (never asserted here; the report shows them)."""
    out: dict[str, Any] = {"parity_all_identical": None, "q8_min_agreement": Q8_MIN_AGREEMENT,
                           "q8_within_tolerance": None, "cartridge_f1_vs_retrieval": []}
    out["min_articles_per_budget"] = MIN_ARTICLES_PER_BUDGET
    out["articles_per_budget"] = [{"budget": b["budget"], "num_articles": b["num_articles"],
                                   "enough": b["num_articles"] >= MIN_ARTICLES_PER_BUDGET} for b in budgets]
    # the questions whose whole answers differ from the main cartridge's, per variant (with their first-token KL)
    out["differing"] = {}
    for b in budgets:
        for label, rows in b.get("agreement_records", {}).items():
            out["differing"].setdefault(label, []).extend(
                {"budget": b["budget"], "qid": r["qid"], "first_token": r["first_token"],
                 "first_token_kl": r["kl"][0] if r.get("kl") else None}
                for r in rows if not r["identical"])
    parities = [b["parity"] for b in budgets if b["parity"] is not None]
    if parities:
        out["parity_all_identical"] = all(p["num_identical"] == p["num_questions"] for p in parities)
        out["parity_identical"] = sum(p["num_identical"] for p in parities)
        out["parity_questions"] = sum(p["num_questions"] for p in parities)
    q8 = [b["agreement"]["q8"] for b in budgets if "q8" in b["agreement"] and b["agreement"]["q8"]["num_questions"]]
    if q8:
        num = sum(a["num_questions"] for a in q8)
        identical = sum(a["identical"] * a["num_questions"] for a in q8) / num
        out["q8_identical"] = identical
        out["q8_within_tolerance"] = identical >= Q8_MIN_AGREEMENT
    out["divergence"] = pooled_divergence(budgets)
    out["divergence_targets"] = {}
    for label, targets in DIVERGENCE_TARGETS.items():
        d = out["divergence"].get(label)
        if not d:
            continue
        met = {}
        for name, bound in targets.items():
            kind, _, key = name.partition("_")
            value = d.get(key)
            met[name] = None if value is None else (value <= bound if kind == "max" else value >= bound)
        out["divergence_targets"][label] = {"targets": targets, "met": met, "all_met": all(v is True for v in met.values())}
    if "bf16" in out["divergence"] and "bf16r" in out["divergence"]:
        ratio = None
        if out["divergence"]["bf16r"]["mean_kl"]:
            ratio = out["divergence"]["bf16"]["mean_kl"] / out["divergence"]["bf16r"]["mean_kl"]
        out["bf16_over_bf16r_mean_kl"] = ratio
        out["bf16r_at_least_5x_lower_kl"] = None if ratio is None else ratio >= 5.0
    for b in budgets:
        s = b["summary"]
        row = {"budget": b["budget"], "cartridge_f1": s["cartridge"]["f1"]}
        for mode in ("bm25", "dense"):
            if mode in s:
                row[f"{mode}_f1"] = s[mode]["f1"]
                row[f"at_or_above_{mode}"] = s["cartridge"]["f1"] >= s[mode]["f1"]
        out["cartridge_f1_vs_retrieval"].append(row)
    return out
