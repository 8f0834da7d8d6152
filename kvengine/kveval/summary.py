"""kveval's figures from its records: per-mode accuracy and latency, parity, variant agreement and divergence.

summarize_budget() aggregates one budget's question records; checks() computes the "Must show" checks over
every budget (never asserted here: the report shows them). Pure functions of the records, so a JSON written
by one run can be summarized again.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvengine.divergence import AnswerDivergence, DivergenceSummary

from .data import scope_articles

# q8's agreement floor with the f32 cartridge: >= 98% identical answers.
Q8_MIN_AGREEMENT = 0.98
# Each budget's scopes are drawn from at least this many articles, so that a variant's agreement is
# not one article's (a single article can flatter a variant); checked per budget in the report.
MIN_ARTICLES_PER_BUDGET = 10
# Targets on the divergence measure (kvengine.divergence), checked in the report:
# label -> (max mean KL over all positions, max mean first-token KL, min identical answers, min top-1 per position)
DIVERGENCE_TARGETS: dict[str, dict[str, float]] = {
    "q8": {"max_first_token_mean_kl": 1e-3, "min_identical": 0.98},
    "q4": {"max_mean_kl": 0.02, "min_identical": 0.85},
    "bf16r": {"min_top1_per_position": 0.99, "min_identical": 0.90},
}


class BudgetConfig(Protocol):
    """What summarize_budget() reads of a run's configuration (runner.EvalConfig)."""

    modes: tuple[str, ...]
    dtype: str


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


def summarize_budget(config: BudgetConfig, budget: int, scope_rows: list[dict[str, Any]],
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
