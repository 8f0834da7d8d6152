"""bench/kv_speed.py's report: the targets checked, the BENCHMARKS.md section and the chart, from its result."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The targets, checked against the largest contexts measured.
TARGETS = {"ttft_ratio_4k": 60.0, "ttft_ratio_8k": 120.0, "floor_ratio_8k": 2.5, "e2e_vs_deepcopy_8k": 1.3,
           "q8_size": 0.27, "q4_size": 0.16, "q8_agreement": 0.98}


def _row_near(rows: list[dict[str, Any]], target: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["target_tokens"] == target), None)


def checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets with the measured figure and whether it was met."""
    rows, out = result["rows"], []

    def add(name: str, measured: float | None, target: float, higher_is_better: bool) -> None:
        if measured is None:
            return
        ok = measured >= target if higher_is_better else measured <= target
        out.append({"check": name, "measured": measured, "target": target, "met": ok, "higher_is_better": higher_is_better})

    r4, r8 = _row_near(rows, 4000), _row_near(rows, 8000)
    d = result["backend"]["dtype"]
    add(f"TTFT re-reading / cartridge at 4k ({d})", r4 and r4["ttft_ratio"], TARGETS["ttft_ratio_4k"], True)
    add(f"TTFT re-reading / cartridge at 8k ({d})", r8 and r8["ttft_ratio"], TARGETS["ttft_ratio_8k"], True)
    add("TTFT cartridge at 8k / floor (no memory)", r8 and r8["floor_ratio"], TARGETS["floor_ratio_8k"], False)
    add("end-to-end deep-copy pattern / cartridge at 8k", r8 and r8["e2e_vs_deepcopy"], TARGETS["e2e_vs_deepcopy_8k"], True)
    add("q8 size / f32 size (largest context)", rows[-1].get("size_q8_ratio"), TARGETS["q8_size"], False)
    add("q4 size / f32 size (largest context)", rows[-1].get("size_q4_ratio"), TARGETS["q4_size"], False)
    add("q8 answers identical to f32 (all probes)", result["agreement"].get("q8"), TARGETS["q8_agreement"], True)
    return out


def markdown(result: dict[str, Any]) -> str:
    """The kvengine section of BENCHMARKS.md."""
    m, rows, floor = result["machine"], result["rows"], result["floor"]
    a = result["args"]
    lb, la = result["load_before"], result["load_after"]
    mb = 1024 * 1024
    d = result["backend"]["dtype"]
    lines = [
        "## kvengine: KV cartridges vs re-reading (bench/kv_speed.py)",
        "",
        f"Measured {result['started_at']} in {result['wall_s'] / 60:.1f} min. Command (from the repository root):",
        "",
        "```",
        f".venv/bin/{result['command']}",
        "```",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores (AVX512-BF16: {'yes' if m['avx512_bf16'] else 'no'}), torch {m['torch']} "
        f"({m['torch_threads']} threads), transformers {m['transformers']}, Python {m['python']}; model "
        f"`{result['backend']['model_id']}` on `{result['backend']['device']}`, sdpa attention, greedy decoding.",
        f"Load average (1/5/15 min) before: {lb[0]:.2f}/{lb[1]:.2f}/{lb[2]:.2f}, after: {la[0]:.2f}/{la[1]:.2f}/{la[2]:.2f}"
        + (" — other processes were sharing the CPU, so absolute times are inflated and noisier than on a quiet machine."
           if max(lb[0], la[0]) > 0.5 * (m["cores"] or 1) else " (a quiet machine)."),
        f"Timings are medians of {a['reps']} runs ({a['text_reps']} for re-reading); answers are {a['answer_tokens']} tokens "
        "(decoded past end-of-turn so every method generates the same number of tokens).",
        "",
        f"### Latency ({d} unless marked)",
        "",
        "| memory tokens | TTFT re-read (s) | TTFT cartridge (s) | re-read / cartridge | cartridge / floor | "
        f"{a['answer_tokens']}-token answer: cartridge (s) | deep-copy pattern (s) | deep-copy / cartridge | re-read (s) | re-read / cartridge |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['num_tokens']} | {r['ttft_text_s']:.2f} | {r['ttft_cartridge_s']:.3f} | **{r['ttft_ratio']:.0f}x** | "
            f"{r['floor_ratio']:.2f}x | {r['e2e_cartridge_s']:.2f} | {r['e2e_deepcopy_s']:.2f} | **{r['e2e_vs_deepcopy']:.2f}x** | "
            f"{r['e2e_text_s']:.2f} | {r['e2e_vs_text']:.1f}x |"
        )
    lines += [
        "",
        f"Floor (the same kind of question, no memory at all, {a['answer_tokens']} tokens): TTFT {floor['ttft_s']:.3f} s, "
        f"end to end {floor['e2e_s']:.2f} s. The deep-copy pattern is transformers' documented prompt reuse: "
        "`copy.deepcopy(prefilled DynamicCache)` then `model.generate(...)` per question; its copy alone took "
        + ", ".join(f"{r['deepcopy_s']:.2f} s" for r in rows) + " at the sizes above.",
        "",
        "### Size, cold start, precision",
        "",
        "| memory tokens | f32 file (MiB) | q8 / f32 | q4 / f32 | bf16 / f32 | cold start f32: read (s) | read + verify + load (s) | "
        "cold start q8 (s) | q4 (s) | prefill f32 (tok/s) | prefill bf16 (tok/s) | TTFT bf16 cartridge (s) | answer bf16 (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bf = "bf16" in r["agree"]
        lines.append(
            f"| {r['num_tokens']} | {r['size_f32_bytes'] / mb:.1f} | {r['size_q8_ratio']:.3f} | {r['size_q4_ratio']:.3f} | "
            + (f"{r['size_bf16_ratio']:.3f}" if bf else "-")
            + f" | {r['cold_f32']['read_s']:.3f} | {r['cold_f32']['ready_s']:.3f} | {r['cold_q8']['ready_s']:.3f} | "
            f"{r['cold_q4']['ready_s']:.3f} | {r['prefill_f32_tok_s']:.0f} | "
            + (f"{r['prefill_bf16_tok_s']:.0f} | {r['ttft_bf16_cartridge_s']:.3f} | {r['e2e_bf16_cartridge_s']:.2f} |" if bf else "- | - | - |")
        )
    ag = result["agreement"]
    lines += [
        "",
        f"Agreement with the {d} cartridge over {result['total_probes']} probe questions (whole greedy answer of up to "
        f"{a['agree_tokens']} tokens identical): " + ", ".join(f"{k} {v:.1%}" for k, v in ag.items())
        + f". For scale: the {d} answers named the right city in {result['f32_accuracy']:.0%} of the probes (a 135M model).",
        "",
        "### Targets",
        "",
        "| check | target | measured | met |",
        "|---|---:|---:|---|",
    ]
    for c in result["checks"]:
        sign = ">=" if c["higher_is_better"] else "<="
        lines.append(f"| {c['check']} | {sign} {c['target']:g} | {c['measured']:.3g} | {'yes' if c['met'] else '**no**'} |")
    lines += [
        "",
        "### GPU",
        "",
        "| device | memory tokens | TTFT re-read | TTFT cartridge | ratio |",
        "|---|---:|---:|---:|---:|",
        "| GPU (bf16) | 1k-8k | not measured | not measured | not measured |",
        "",
        "No GPU was lent to this task. `bench/gpu_bench.sh` runs the same benchmark on a CUDA machine in one short call "
        "(bf16, `--device cuda`) and prints this section for it.",
        "",
        f"![KV cartridge speed]({_chart_link(a['out'])})",
    ]
    return "\n".join(lines) + "\n"


def _chart_link(out: str) -> str:
    """The chart's path relative to the repository root (where BENCHMARKS.md lives)."""
    path = Path(out).resolve() / "kv_speed.png"
    return os.path.relpath(path, ROOT)


def chart(result: dict[str, Any], path: Path) -> None:
    """TTFT and end-to-end against memory size (log scale), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    x = [r["num_tokens"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.plot(x, [r["ttft_text_s"] for r in rows], "o-", label="re-reading the text")
    ax1.plot(x, [r["ttft_cartridge_s"] for r in rows], "o-", label="cartridge (f32)")
    if "ttft_bf16_cartridge_s" in rows[0]:
        ax1.plot(x, [r["ttft_bf16_cartridge_s"] for r in rows], "o--", label="cartridge (bf16)")
    ax1.axhline(result["floor"]["ttft_s"], color="grey", ls=":", label="floor: no memory")
    ax1.set(xscale="log", yscale="log", xlabel="memory tokens", ylabel="seconds", title="Time to first token")
    ax1.legend()
    n = result["args"]["answer_tokens"]
    ax2.plot(x, [r["e2e_text_s"] for r in rows], "o-", label="re-reading the text")
    ax2.plot(x, [r["e2e_deepcopy_s"] for r in rows], "o-", label="deep-copy DynamicCache + generate()")
    ax2.plot(x, [r["e2e_cartridge_s"] for r in rows], "o-", label="cartridge (f32)")
    ax2.axhline(result["floor"]["e2e_s"], color="grey", ls=":", label="floor: no memory")
    ax2.set(xscale="log", yscale="log", xlabel="memory tokens", ylabel="seconds", title=f"{n}-token answer, end to end")
    ax2.legend()
    fig.suptitle(f"SmolLM2-135M-Instruct, {result['machine']['cpu']}, {result['machine']['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
