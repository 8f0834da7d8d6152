#!/usr/bin/env python
"""One decoding step's time under each candidate way of running the weights, before choosing one.

Times one single-token step of the real default model over a KV cache of ``--contexts`` positions for: ``f32``;
weight-only int8 through ``torch._weight_int8pack_mm`` on f32 or bf16 activations (``int8pack f32-act`` /
``bf16-act``, ``+head`` with the LM head too); ``dynamic`` (``quantize_dynamic``) and ``torchao`` when they
import; and each under ``torch.compile`` with ``--compile``. The KV buffers hold random values (a step's time does
not depend on them). Medians of ``--steps`` steps after ``--warmup``, ``--threads`` threads, the load recorded.

``--divergence`` also judges each int8 candidate as the gate judges a variant (kvengine.divergence: mean KL to
f32 and top-1 per answer position) on LoCoMo development scopes (evaluation use only). Figures and the choice
made from them: BENCHMARKS.md, "Weight precision and per-step overhead".

    OMP_NUM_THREADS=2 .venv/bin/python bench/decode_step_candidates.py --contexts 2048,8192 --out bench/results/decode_step_candidates.json
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvengine import make_backend  # noqa: E402
from kvengine.kvcache import CartridgeCache, KvState  # noqa: E402
from kvengine.precision import weight_int8  # noqa: E402


def int8pack(model: torch.nn.Module, *, head: bool, act_dtype: torch.dtype) -> torch.nn.Module:
    return weight_int8(copy.deepcopy(model), head=head, act_dtype=act_dtype)


def dynamic(model: torch.nn.Module) -> torch.nn.Module | None:
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError:
        return None
    model = copy.deepcopy(model)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untie, so only the head changes
    return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def torchao_int8(model: torch.nn.Module) -> torch.nn.Module | None:
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        return None
    model = copy.deepcopy(model)
    lm_head = model.get_output_embeddings()
    quantize_(model, Int8WeightOnlyConfig(), filter_fn=lambda m, _fqn: isinstance(m, torch.nn.Linear) and m is not lm_head)
    return model


LOCOMO = ROOT.parent.parent / "shared" / "data" / "locomo" / "locomo_dev.json"


def locomo_scopes(backend, *, tokens: int, questions: int) -> list[tuple[list[str], list[str]]]:
    """Per LoCoMo development conversation: (its first turns up to ``tokens`` tokens, questions answered in them)."""
    path = LOCOMO if LOCOMO.is_file() else Path("/work/shared/data/locomo/locomo_dev.json")
    scopes = []
    for sample in json.loads(path.read_text()):
        conv, turns = sample["conversation"], []
        for n in range(1, 40):
            for turn in conv.get(f"session_{n}", []):
                turns.append((turn["dia_id"], f"{conv[f'session_{n}_date_time']}: {turn['speaker']}: {turn['text']}"))
        kept = []
        for dia_id, text in turns:
            if backend.count_tokens([t for _, t in kept] + [text]) > tokens:
                break
            kept.append((dia_id, text))
        ids = {dia_id for dia_id, _ in kept}
        qs = [q["question"] for q in sample["qa"] if q.get("category") != 5 and q.get("evidence") and set(q["evidence"]) <= ids]
        if qs:
            scopes.append(([t for _, t in kept], qs[:questions]))
    return scopes


def divergence(f32_backend, variants: dict, *, tokens: int, questions: int, num_scopes: int) -> dict:
    """The gate's measure (kvengine.divergence) of each variant backend against ``f32_backend`` on LoCoMo scopes, and
    each one's parity: the share of questions whose answer from its cartridge is its re-reading's, token for token."""
    from kvengine.divergence import AnswerDivergence, DivergenceSummary

    scopes = locomo_scopes(f32_backend, tokens=tokens, questions=questions)[:num_scopes]
    per = {name: [] for name in variants}
    parity = {name: [] for name in ["f32", *variants]}
    for texts, qs in scopes:
        reference = f32_backend.compile(texts)
        carts = {name: b.compile(texts) for name, b in variants.items()}
        for q in qs:
            ref = f32_backend.answer(reference, q, max_new_tokens=16)
            ref_logp = f32_backend.answer_logprobs(reference, q, ref.token_ids)
            parity["f32"].append(f32_backend.answer_from_text(texts, q, max_new_tokens=16).token_ids == ref.token_ids)
            for name, b in variants.items():
                var_logp = b.answer_logprobs(carts[name], q, ref.token_ids)
                answer = b.answer(carts[name], q, max_new_tokens=16).token_ids
                per[name].append(AnswerDivergence.of(ref_logp, var_logp, identical=answer == ref.token_ids))
                parity[name].append(b.answer_from_text(texts, q, max_new_tokens=16).token_ids == answer)
    return {"scopes": len(scopes), "tokens": tokens, "questions": len(parity["f32"]),
            "by_candidate": {name: DivergenceSummary.of(answers).as_dict() for name, answers in per.items()},
            "cartridge_equals_re_reading": {name: sum(v) / len(v) if v else None for name, v in parity.items()}}


def weight_bytes(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def step_ms(model, state: KvState, *, warmup: int, steps: int, forward=None) -> float:
    forward = forward or model
    times = []
    with torch.inference_mode():
        for i in range(warmup + steps):
            cache = CartridgeCache(state)
            started = time.perf_counter()
            logits = forward(input_ids=torch.tensor([[1000 + i]]), cache=cache, use_cache=True).logits
            int(logits[0, -1].argmax())
            if i >= warmup:
                times.append(time.perf_counter() - started)
            cache.crop_back()
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also time each candidate under torch.compile (inductor)")
    parser.add_argument("--only", default="", help="comma-separated candidate names (default: all)")
    parser.add_argument("--divergence", action="store_true", help="also the gate's divergence of each int8 candidate from f32")
    parser.add_argument("--div-tokens", type=int, default=1000)
    parser.add_argument("--div-questions", type=int, default=6)
    parser.add_argument("--div-scopes", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    backend = make_backend("transformers", dtype="f32", device="cpu")
    base = backend.model
    builders = {
        "f32": lambda: base,
        "int8pack f32-act": lambda: int8pack(base, head=False, act_dtype=torch.float32),
        "int8pack bf16-act": lambda: int8pack(base, head=False, act_dtype=torch.bfloat16),
        "int8pack bf16-act +head": lambda: int8pack(base, head=True, act_dtype=torch.bfloat16),
        "dynamic": lambda: dynamic(base),
        "torchao": lambda: torchao_int8(base),
    }
    only = [n for n in args.only.split(",") if n]
    text = base.config.get_text_config()
    heads, dim = backend.kv_shape
    contexts = [int(c) for c in args.contexts.split(",")]
    states = {}
    for n in contexts:
        g = torch.Generator().manual_seed(n)
        keys = [torch.randn(1, heads, n, dim, generator=g) for _ in range(text.num_hidden_layers)]
        values = [torch.randn(1, heads, n, dim, generator=g) for _ in range(text.num_hidden_layers)]
        states[n] = KvState(keys, values, room=64)
    rows = []
    for name, build in builders.items():
        if only and name not in only:
            continue
        model = build()
        if model is None:
            rows.append({"candidate": name, "available": False})
            print(name, "not available", flush=True)
            continue
        variants = [(name, None)]
        if args.compile:
            variants.append((f"{name} compiled", torch.compile(model.forward, dynamic=True)))
        for label, forward in variants:
            row = {"candidate": label, "available": True, "weight_mb": round(weight_bytes(model) / 1e6, 1)}
            for n in contexts:
                started = time.perf_counter()
                try:
                    row[f"step_ms_{n}"] = round(step_ms(model, states[n], warmup=args.warmup, steps=args.steps, forward=forward), 2)
                except Exception as exc:  # noqa: BLE001 - a candidate that fails is reported, not fatal
                    row[f"error_{n}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                row[f"wall_s_{n}"] = round(time.perf_counter() - started, 1)
            row["loadavg"] = [round(x, 2) for x in os.getloadavg()]
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"torch": torch.__version__, "threads": args.threads, "steps": args.steps, "rows": rows}
    if args.divergence:
        import kvengine.precision as precision

        variants = {}
        candidates = (("int8pack bf16-act", False, torch.bfloat16), ("int8pack bf16-act +head", True, torch.bfloat16),
                      ("int8pack f32-act +head", True, torch.float32))
        for label, head, act in candidates if not only else [c for c in candidates if c[0] in only]:
            saved = precision.INT8_HEAD, precision.INT8_ACT_DTYPE
            precision.INT8_HEAD, precision.INT8_ACT_DTYPE = head, act
            try:
                variants[label] = backend.variant(dtype="f32w8")
            finally:
                precision.INT8_HEAD, precision.INT8_ACT_DTYPE = saved
        variants["bf16r"] = backend.variant(dtype="bf16r")  # for scale: the precision already served
        variants["bf16w8"] = backend.variant(dtype="bf16w8")  # the int8 layers (as served) over bf16 KV, a bf16 head
        saved = dict(precision.INT8_HEAD_DTYPES)
        precision.INT8_HEAD_DTYPES["bf16w8"] = torch.float32
        try:
            variants["bf16w8, f32 head"] = backend.variant(dtype="bf16w8")
        finally:
            precision.INT8_HEAD_DTYPES.update(saved)
        started = time.perf_counter()
        result["divergence"] = divergence(backend, variants, tokens=args.div_tokens, questions=args.div_questions,
                                          num_scopes=args.div_scopes)
        result["divergence"]["seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps(result["divergence"], indent=1), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
