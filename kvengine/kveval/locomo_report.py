"""The markdown report of a LoCoMo run: evidence recall@k per retriever and category, F1 per mode and category."""
from __future__ import annotations

from typing import Any

from .labels import MODE_LABELS
from .locomo import CATEGORIES

_LABELS = {**MODE_LABELS, "hybrid": "hybrid (BM25 + dense, RRF) top-k text",
           "cartridge": "cartridge of the first window"}


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.0f} ms"


def recall_table(results: dict[str, Any]) -> str:
    """Recall@k (%) of the evidence turns: one row per retriever and k, one column per category."""
    recall = results["recall"]
    counts = recall["num_questions"]
    columns = [c for c in ("1", "2", "3", "4", "5") if c in counts] + ["all"]
    head = " | ".join(f"{CATEGORIES[int(c)]} ({c})" if c != "all" else "all" for c in columns)
    lines = [f"| retriever | k | {head} |", "|---|---:|" + "---:|" * len(columns),
             "| questions with evidence | | " + " | ".join(str(counts[c]) for c in columns) + " |"]
    for name in results["config"]["retrievers"]:
        for k, cell in recall[name].items():
            lines.append(f"| {name} | {k} | " + " | ".join(_fmt(cell.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def answers_table(results: dict[str, Any]) -> str:
    """Per mode: token F1 (%) per category 1-4 and over them, category 5 apart, evidence recall and latency."""
    head = " | ".join(f"{CATEGORIES[c]} F1" for c in (1, 2, 3, 4))
    lines = [f"| mode | questions | {head} | F1 (1-4) | adversarial (5) acc. | evidence recall | TTFT p50 | TTFT p95 |",
             "|---|---:|" + "---:|" * 9]
    for mode, s in results["summary"].items():
        cats = " | ".join(_fmt(s["f1_by_category"][str(c)]) for c in (1, 2, 3, 4))
        lines.append(f"| {_LABELS.get(mode, mode)} | {s['num_questions']} | {cats} | {_fmt(s['f1_1_4'])} | "
                     f"{_fmt(s['adversarial_accuracy'])} | {_fmt(s['evidence_recall'])} | "
                     f"{_ms(s['ttft_s']['median'])} | {_ms(s['ttft_s']['p95'])} |")
    return "\n".join(lines)


def markdown_report(results: dict[str, Any]) -> str:
    """The whole LoCoMo report."""
    config = results["config"]
    data = results["data"]
    asked = sum(c["num_asked"] for c in data["conversations"])
    out = ["# kveval on LoCoMo", ""]
    if results.get("command"):
        out += [f"Command: `{results['command']}`", ""]
    out += [f"Data: `{data.get('file', '?')}`, {data['num_conversations']} conversation(s) "
            f"({', '.join(c['sample_id'] for c in data['conversations'])}), {data['num_questions']} question(s) in "
            f"categories {list(config['categories'])}; machine: {results['machine'].get('cpu', '?')}, "
            f"{results['wall_s']} s.", "",
            "Scores follow the paper's evaluation (snap-research/LoCoMo `task_eval/evaluation.py`): normalized, "
            "Porter-stemmed token F1; multi-hop (1) averages the best F1 over its comma-separated answer parts; "
            "open-domain (3) scores the answer's part before ';'; adversarial (5) counts an answer right when it "
            "says the conversation does not mention it, and is reported apart from the F1.", "",
            "## Evidence recall@k", "",
            "Fraction (%) of a question's evidence turns among the retriever's top k, over every selected question "
            "whose evidence resolves to turns.", "", recall_table(results), ""]
    if results["summary"]:
        subset = ("all" if config["questions_per_conversation"] is None
                  else f"{config['questions_per_conversation']} drawn with seed {config['seed']}")
        out += ["## Answers", "",
                f"{asked} question(s) asked ({subset} per conversation), top k = {config['top_k']}, "
                f"at most {config['max_new_tokens']} new tokens, greedy, {config['dtype']}.", "",
                answers_table(results), ""]
        windows = [c for c in data["conversations"] if "cartridge" in c]
        if windows:
            out += ["Cartridge windows: " + ", ".join(
                f"{c['sample_id']} {c['cartridge']['num_memories']}/{c['num_memories']} turns "
                f"({c['cartridge']['num_tokens']} tokens)" for c in windows), ""]
    if data["oddities"]:
        out += ["## Odd items in the file", "", "| kind | count |", "|---|---:|"]
        out += [f"| {kind} | {count} |" for kind, count in data["oddities"].items()]
        out.append("")
    return "\n".join(out)
