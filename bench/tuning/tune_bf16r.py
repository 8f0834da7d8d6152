"""Where bf16r's remaining divergence from f32 comes from, by the teacher-forced measure (kvengine.divergence).

Variants are f32 models with one bf16 rounding added at a time (weights, matmul inputs, matmul outputs), beside
today's bf16 and bf16r, on SQuAD scopes the final kveval run never sees (articles after the first 20).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/tuning/tune_bf16r.py --squad-file /tmp/squad.json \
        --out bench/results/kveval-bf16r/tune_bf16r.json
"""
from __future__ import annotations

import copy
import json
import time

import torch

from bench.tuning import divergence, f32_references, parser
from kvengine import make_backend


def _round_in(module, args):
    return (args[0].to(torch.bfloat16).float(), *args[1:])


def _round_out(module, args, out):
    return out.to(torch.bfloat16).float()


def emulated(f32, *, weights: bool, inputs: bool, outputs: bool, only: tuple[str, ...] = ()):
    """An f32 backend whose linear layers (not the LM head) round their weights/inputs/outputs to bf16."""
    other = copy.copy(f32)
    other.model = copy.deepcopy(f32.model).eval()
    head = other.model.get_output_embeddings()
    if head is not None and head.weight is other.model.get_input_embeddings().weight:  # tied: untie before rounding
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
    for name, m in other.model.named_modules():
        if isinstance(m, torch.nn.Linear) and m is not head and (not only or name.endswith(only)):
            if weights:
                m.weight.data = m.weight.data.to(torch.bfloat16).float()
            if inputs:
                m.register_forward_pre_hook(_round_in)
            if outputs:
                m.register_forward_hook(_round_out)
    return other


def main() -> None:
    a = parser(scopes=2, questions=24, only_sep=";").parse_args()
    torch.set_num_threads(1)
    f32 = make_backend("transformers", dtype="f32", device="cpu")
    refs = f32_references(f32, a)
    import kvengine.precision as precision

    def bf16r_with(exact_outputs):
        def make():
            precision.EXACT_OUTPUTS = exact_outputs
            return f32.variant(dtype="bf16r")
        return make

    variants = {
        "bf16": lambda: f32.variant(dtype="bf16"),
        "bf16r (rounded outputs)": bf16r_with(()),
        "bf16r, exact q,k,gate,up outputs": bf16r_with(("q_proj", "k_proj", "gate_proj", "up_proj")),
        "bf16r, exact outputs but v": bf16r_with(("q_proj", "k_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
        "bf16r, exact q,k,o outputs": bf16r_with(("q_proj", "k_proj", "o_proj")),
        "bf16r, exact q,k,o,down outputs": bf16r_with(("q_proj", "k_proj", "o_proj", "down_proj")),
        "bf16r, exact outputs": bf16r_with(("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
        "f32, bf16 weights": lambda: emulated(f32, weights=True, inputs=False, outputs=False),
        "f32, bf16 weights + inputs": lambda: emulated(f32, weights=True, inputs=True, outputs=False),
        "f32, bf16 weights + inputs + outputs": lambda: emulated(f32, weights=True, inputs=True, outputs=True),
        "f32, bf16 inputs + outputs": lambda: emulated(f32, weights=False, inputs=True, outputs=True),
    }
    only = [n for n in a.only.split(";") if n]
    results = {}
    for name, make in variants.items():
        if only and name not in only:
            continue
        backend = make()
        start = time.perf_counter()
        d, _ = divergence(backend, refs)
        d["seconds"] = round(time.perf_counter() - start, 1)
        results[name] = d
        print(f"{name}: mean KL {d['mean_kl']:.3e} p95 {d['p95_kl']:.3e} first {d['first_token_mean_kl']:.3e} "
              f"top1 {100 * d['top1_per_position']:.2f}% ({d['num_positions']} pos) {d['seconds']}s", flush=True)
        del backend
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"scopes": [(s.article, s.num_tokens) for s in refs.scopes], "questions": len(refs.refs), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
