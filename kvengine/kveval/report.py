"""Write a run's results: JSON (everything), a markdown report (tables) and PNG charts (matplotlib, Agg)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .labels import MODE_LABELS
from .locomo_report import markdown_report as locomo_markdown

# LoCoMo is CC BY-NC, for evaluation only: its files never hold the conversation's words, the questions or the gold
# answers (nor the prompts and predictions, which quote them); records keep ids, categories, scores and timings.
DATASET_TEXT_FIELDS = ("question", "answer", "answers", "prompt", "prediction", "scored_text", "options")


def without_dataset_text(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` with the dataset's text removed from every record (see DATASET_TEXT_FIELDS)."""
    def strip(records: Any) -> Any:
        if not isinstance(records, list):
            return records
        return [{k: v for k, v in r.items() if k not in DATASET_TEXT_FIELDS} if isinstance(r, dict) else r for r in records]

    return {key: strip(value) if key in ("records", "recall_records") else value for key, value in results.items()}


def write_report(results: dict[str, Any], out_dir: Path, *, command: str | None = None) -> dict[str, Path]:
    """Write results.json, results.md, accuracy_vs_budget.png and latency_vs_budget.png into ``out_dir``.

    A LoCoMo run (``results["dataset"] == "locomo"``) gets results.json and its own results.md only.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if command:
        results = {**results, "command": command}
    if results.get("dataset") == "locomo":  # per-category tables, no per-budget charts
        results = without_dataset_text(results)
        paths = {"json": out_dir / "results.json", "markdown": out_dir / "results.md"}
        paths["json"].write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        paths["markdown"].write_text(locomo_markdown(results), encoding="utf-8")
        return paths
    paths = {
        "json": out_dir / "results.json",
        "markdown": out_dir / "results.md",
        "accuracy_png": out_dir / "accuracy_vs_budget.png",
        "latency_png": out_dir / "latency_vs_budget.png",
    }
    paths["json"].write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown_report(results), encoding="utf-8")
    plot_accuracy(results, paths["accuracy_png"])
    plot_latency(results, paths["latency_png"])
    return paths


def _in_mode_order(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    """Items of a per-mode dict in MODE_LABELS order (JSON files store them sorted by name)."""
    order = list(MODE_LABELS)
    return sorted(summary.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value < 0.01:
        return f"{value * 1000:.2f} ms"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _kl(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2e}"


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / (1 << 20):.1f} MiB"


def headline_table(results: dict[str, Any]) -> str:
    """Per budget and mode: EM, F1, time to first token and end-to-end latency (median / p95)."""
    lines = [
        "| budget (tokens) | mode | questions | EM % | F1 % | TTFT median | TTFT p95 | end-to-end median | end-to-end p95 | prompt tokens run |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in results["budgets"]:
        for mode, s in _in_mode_order(b["summary"]):
            lines.append(
                f"| {b['budget']} | {MODE_LABELS.get(mode, mode)} | {s['num_questions']} | {_fmt(s['em'])} | "
                f"{_fmt(s['f1'])} | {_seconds(s['ttft_s']['median'])} | {_seconds(s['ttft_s']['p95'])} | "
                f"{_seconds(s['total_s']['median'])} | {_seconds(s['total_s']['p95'])} | "
                f"{_fmt(s['mean_prompt_tokens'], 0)} |"
            )
    return "\n".join(lines)


def variants_table(results: dict[str, Any]) -> str:
    """Per budget: cartridge size per kind and the agreement of each variant with the main cartridge."""
    main = results["config"]["dtype"]
    lines = [
        "| budget | cartridge | size (all scopes) | bytes/token | size vs " + main + " | identical answers | "
        "first token same | token agreement | F1 % | mean KL | p95 KL | first-token KL | top-1 per position |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in results["budgets"]:
        total = {}
        for scope in b["scopes"]:
            for label, size in scope["size_bytes"].items():
                total[label] = total.get(label, 0) + size
        cfg = results["config"]
        order = [main, *cfg.get("quants", []), *cfg.get("compare_dtypes", [])]
        for label, size in sorted(total.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)):
            a = b["agreement"].get(label)
            if label == main:
                agree = ("(reference)", "", "", _fmt(b["summary"]["cartridge"]["f1"]), "", "", "", "")
            elif a and a["num_questions"]:
                d = a.get("divergence") or {}
                agree = (f"{100 * a['identical']:.1f}% ({a['num_questions']})", f"{100 * a['first_token']:.1f}%",
                         f"{100 * a['token_agreement']:.1f}%", _fmt(a["f1"]), _kl(d.get("mean_kl")), _kl(d.get("p95_kl")),
                         _kl(d.get("first_token_mean_kl")),
                         "n/a" if d.get("top1_per_position") is None else f"{100 * d['top1_per_position']:.2f}%")
            else:
                agree = ("n/a",) * 8
            lines.append(
                f"| {b['budget']} | {label} | {_mib(size)} | {_fmt(b['bytes_per_token'].get(label), 0)} | "
                f"{_fmt(b['size_ratio'].get(label), 3)} | " + " | ".join(agree) + " |"
            )
    return "\n".join(lines)


def checks_section(results: dict[str, Any]) -> str:
    """The "Must show" checks in words, from the figures."""
    c = results["checks"]
    lines = []
    if c.get("parity_all_identical") is not None:
        verdict = "yes" if c["parity_all_identical"] else "NO"
        lines.append(f"- f32 cartridge answers token-for-token equal to text re-reading on every question: **{verdict}** "
                     f"({c['parity_identical']}/{c['parity_questions']}).")
    if c.get("q8_within_tolerance") is not None:
        verdict = "yes" if c["q8_within_tolerance"] else "NO"
        lines.append(f"- q8 cartridge answers identical to the f32 cartridge's: {100 * c['q8_identical']:.1f}% "
                     f"(tolerance >= {100 * c['q8_min_agreement']:.0f}%): **{verdict}**.")
    for label, d in sorted(c.get("divergence", {}).items()):
        lines.append(f"- {label} vs the main cartridge, teacher-forced over {d['num_questions']} questions "
                     f"({d['num_positions']} positions): mean KL {_kl(d['mean_kl'])}, p95 {_kl(d['p95_kl'])}, first-token "
                     f"{_kl(d['first_token_mean_kl'])}, top-1 per position {100 * d['top1_per_position']:.2f}%, "
                     f"whole answers identical {100 * d['identical']:.1f}%.")
    for row in c.get("articles_per_budget", []):
        verdict = "yes" if row["enough"] else "NO"
        lines.append(f"- {row['budget']} tokens: scopes drawn from {row['num_articles']} articles "
                     f"(target: >= {c['min_articles_per_budget']}): **{verdict}**.")
    for label, rows in sorted(c.get("differing", {}).items()):
        if rows:
            cells = ", ".join(f"{r['qid']} ({r['budget']} tok, first token {'same' if r['first_token'] else 'differs'}, "
                              f"first-token KL {_kl(r['first_token_kl'])})" for r in rows)
            lines.append(f"- {label}: whole answers that differ from the main cartridge's ({len(rows)}): {cells}.")
    for label, t in sorted(c.get("divergence_targets", {}).items()):
        verdict = "yes" if t["all_met"] else "NO"
        lines.append(f"- {label} targets {t['targets']}: **{verdict}** ({t['met']}).")
    if c.get("bf16_over_bf16r_mean_kl") is not None:
        verdict = "yes" if c["bf16r_at_least_5x_lower_kl"] else "NO"
        lines.append(f"- bf16r mean KL {c['bf16_over_bf16r_mean_kl']:.1f}x lower than bf16 (target >= 5x): **{verdict}**.")
    for row in c["cartridge_f1_vs_retrieval"]:
        parts = []
        for mode in ("bm25", "dense"):
            if f"{mode}_f1" in row:
                sign = ">=" if row[f"at_or_above_{mode}"] else "<"
                parts.append(f"{sign} {MODE_LABELS[mode]} {_fmt(row[f'{mode}_f1'])}")
        if parts:
            lines.append(f"- {row['budget']} tokens: cartridge F1 {_fmt(row['cartridge_f1'])} " + ", ".join(parts) + ".")
    for b in results["budgets"]:
        ratio = b.get("ttft_ratio_text_over_cartridge")
        if ratio is not None:
            lines.append(f"- {b['budget']} tokens: median time to first token, text re-reading / cartridge = **{ratio:.1f}x** "
                         f"({_seconds(b['summary']['text']['ttft_s']['median'])} vs "
                         f"{_seconds(b['summary']['cartridge']['ttft_s']['median'])}).")
    return "\n".join(lines)


def scopes_table(results: dict[str, Any]) -> str:
    """Which articles were packed into each budget, how large, and how long compiling took."""
    lines = ["| budget | article | paragraphs | memory tokens | questions asked | compile (main) |",
             "|---:|---|---:|---:|---:|---:|"]
    main = results["config"]["dtype"]
    for b in results["budgets"]:
        for s in b["scopes"]:
            lines.append(f"| {b['budget']} | {s['article']} | {s['num_paragraphs']} | {s['num_tokens']} | "
                         f"{s['num_questions']} | {_seconds(s['compile_s'].get(main))} |")
    return "\n".join(lines)


def retrieval_recall(results: dict[str, Any]) -> str:
    """How often the top-k retrieval held the paragraph that answers the question."""
    parts = []
    for b in results["budgets"]:
        cells = [f"{MODE_LABELS[m]} {100 * b['summary'][m]['gold_recall']:.0f}%"
                 for m in ("bm25", "dense") if m in b["summary"] and b["summary"][m]["gold_recall"] is not None]
        if cells:
            parts.append(f"- {b['budget']} tokens: " + ", ".join(cells))
    return "\n".join(parts)


def markdown_report(results: dict[str, Any]) -> str:
    """The whole markdown report."""
    cfg = results["config"]
    m = results["machine"]
    backend = results.get("backend", {})
    out = [
        "# kveval: cartridge vs text re-reading vs top-k retrieval on SQuAD v1.1 dev",
        "",
        f"Model `{backend.get('model_id', cfg.get('model'))}` ({cfg['backend']}), {cfg['dtype']}, device "
        f"{backend.get('device', cfg['device'])}; greedy decoding, at most {cfg['max_new_tokens']} new tokens; "
        f"top-k = {cfg['top_k']}; question template `{cfg['question_template']}`; seed {cfg['seed']}.",
        f"Machine: {m.get('cpu')}, {m.get('num_cpus')} CPUs, torch {m.get('torch', 'n/a')} "
        f"({m.get('torch_threads', 'n/a')} threads), transformers {m.get('transformers', 'n/a')}, "
        f"Python {m.get('python')}. Run started {results.get('started_at')}, took {results.get('wall_s')} s.",
    ]
    if results.get("command"):
        out += ["", "Command:", "", "```", results["command"], "```"]
    out += ["", "## Must show", "", checks_section(results), "",
            "## Accuracy and latency per budget and mode", "", headline_table(results), "",
            "TTFT for the retrieval modes includes the retrieval itself. EM/F1: official SQuAD v1.1 normalization, "
            "max over the accepted answers, in percent.", "",
            "## Cartridge size and agreement with the main cartridge", "", variants_table(results), "",
            "## Retrieval: gold paragraph in the top-k", "", retrieval_recall(results) or "(no retrieval modes)", "",
            "## Scopes", "", scopes_table(results), "",
            "## Machine load (1/5/15-minute load average before and after each budget)", ""]
    for b in results["budgets"]:
        out.append(f"- {b['budget']} tokens: before {b['load_avg']['before']}, after {b['load_avg']['after']}")
    out.append("")
    if results.get("erasure"):
        out += [erasure_markdown(results["erasure"], level=2), ""]
    return "\n".join(out)


def erasure_markdown(erasure: dict[str, Any], *, level: int = 1) -> str:
    """The erasure check in words and a small table (from `python manage.py kveval`)."""
    c = erasure["checks"]
    f = erasure["figures"]

    def yes(ok: bool) -> str:
        return "**yes**" if ok else "**NO**"

    lines = [
        f"{'#' * level} Erasure check ({erasure['configuration']})",
        "",
        f"Article *{erasure['article']}*: {erasure['num_paragraphs']} paragraphs ({erasure['num_tokens']} tokens), one "
        f"subject per paragraph, in scope `{erasure['scope']}`; paragraph {erasure['erased_paragraph']} erased "
        f"(erasure request #{erasure['erasure_request_id']}); scope `{erasure['never_stored_scope']}` holds the same "
        f"paragraphs without it. {erasure['num_questions']} question(s) about the erased paragraph, "
        f"at most {erasure['max_new_tokens']} new tokens.",
        "",
        "| answered from | EM % | F1 % |",
        "|---|---:|---:|",
        f"| cartridge before erasure | {_fmt(f['before']['em'])} | {_fmt(f['before']['f1'])} |",
        f"| rebuilt cartridge after erasure | {_fmt(f['after']['em'])} | {_fmt(f['after']['f1'])} |",
        f"| cartridge of the never-stored scope | {_fmt(f['never_stored']['em'])} | {_fmt(f['never_stored']['f1'])} |",
        "",
        f"- the old cartridge is destroyed (state and blob): {yes(c['old_version_destroyed'])}",
        f"- the rebuilt cartridge leaves the erased memory out: {yes(c['erased_memory_left_out'])}",
        f"- rebuilt blob byte-identical to the never-stored one: {yes(c['rebuilt_blob_equals_never_stored'])} "
        f"(sha256 {erasure['blob_sha256']['rebuilt'][:16]}... vs {erasure['blob_sha256']['never_stored'][:16]}...)",
        f"- answers after erasure identical to the never-stored scope's: {yes(c['answers_equal_never_stored'])}",
        f"- answered no better than when never stored: {yes(c['no_better_than_never_stored'])}",
        "- timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in erasure["timings_s"].items()),
    ]
    return "\n".join(lines)


def _budgets_and_series(results: dict[str, Any], key: Sequence[str]) -> tuple[list[int], dict[str, list]]:
    budgets = [b["budget"] for b in results["budgets"]]
    series: dict[str, list] = {}
    for b in results["budgets"]:
        for mode, s in b["summary"].items():
            value: Any = s
            for k in key:
                value = value[k]
            series.setdefault(mode, []).append(value)
    return budgets, dict(_in_mode_order(series))  # a fixed order keeps each mode's colour across charts and runs


def _line_style(mode: str) -> dict[str, Any]:
    """Cartridge wide and pale under a dashed text line: with parity the two coincide and both stay visible."""
    if mode == "cartridge":
        return {"linewidth": 5, "alpha": 0.45}
    if mode == "text":
        return {"linestyle": "--"}
    return {}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers or CI
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(results: dict[str, Any], path: Path) -> None:
    """F1 and EM against budget, one line per mode."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, title in ((axes[0], "f1", "F1 (%)"), (axes[1], "em", "Exact match (%)")):
        budgets, series = _budgets_and_series(results, (metric,))
        for mode, values in series.items():
            ax.plot(budgets, values, marker="o", label=MODE_LABELS.get(mode, mode), **_line_style(mode))
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("memory budget (tokens)")
        ax.set_ylabel(title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"SQuAD v1.1 dev accuracy vs memory budget ({results.get('backend', {}).get('model_id', '')}, "
                 f"{results['config']['dtype']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(results: dict[str, Any], path: Path) -> None:
    """Median time to first token and end-to-end latency against budget, one line per mode (log scale)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "ttft_s", "time to first token, median (s)"),
                           (axes[1], "total_s", "end-to-end latency, median (s)")):
        budgets, series = _budgets_and_series(results, (key, "median"))
        for mode, values in series.items():
            ax.plot(budgets, values, marker="o", label=MODE_LABELS.get(mode, mode), **_line_style(mode))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("memory budget (tokens)")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend()
    fig.suptitle("Latency vs memory budget (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
