#!/usr/bin/env python
"""Speed benchmark of KV cartridges against re-reading the memories, in one run.

For memory contexts of about 1k, 2k, 4k and 8k tokens of synthetic facts ("Ada Brandt lives in Oslo and
works as a nurse."), on the default model (SmolLM2-135M-Instruct), it measures:

- time to first token (TTFT): cartridge vs re-reading the text vs the floor (the question, no memory);
- end to end for a fixed-length answer (default 16 tokens): cartridge vs re-reading vs transformers'
  documented prompt-reuse pattern (copy.deepcopy of a prefilled DynamicCache, then generate());
- cold start: cartridge file on disk -> ready to answer, against just reading the file;
- stored size of f32, bf16, q8 and q4 cartridges; their answers' agreement with f32 on probe questions;
- bf16 against f32: prefill (compile) speed and cartridge TTFT / end to end.

It writes JSON, a markdown table and a PNG chart under --out (kv_speed_report.py); bench/report.py then
regenerates BENCHMARKS.md. Timings are medians of --reps runs (--text-reps for re-reading).
Example: .venv/bin/python bench/kv_speed.py && .venv/bin/python bench/report.py
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kv_speed_report import chart, checks, markdown  # noqa: E402 - bench/, beside this script

FIRST = ("Ada Bruno Chloe Dario Elena Felix Greta Hugo Irene Jonas Kira Liam Maya Nils Olga Pavel Quinn Rosa Sami "
         "Tara Umar Vera Wanda Xavier Yara Zeno Amir Bea Cyril Dina Emil Fiona Gabor Hana Ivo Jana Karl Lena Marco Nora").split()
LAST = ("Adler Brandt Costa Dubois Eriksen Fischer Garcia Horvat Ibsen Jensen Kowalski Larsen Moreau Novak Olsen "
        "Petrov Quist Rossi Silva Tanaka Ueda Varga Weber Xu Yilmaz Zhang Alves Becker Castro Duarte Engel Falk "
        "Gomez Hansen Ito Jovanovic Kim Lopez Meyer Nagy").split()
CITIES = ("Oslo Lisbon Porto Lyon Ghent Turin Graz Krakow Brno Tartu Bergen Malmo Aarhus Basel Bilbao Seville Bari "
          "Split Varna Cluj Pecs Riga Vilnius Tampere Cork Galway Leeds Bristol Cardiff Dundee Utrecht Leiden Bremen "
          "Kiel Dresden Bonn Nantes Rennes Dijon Nice Genoa Verona Parma Siena Zadar Ohrid Plovdiv Izmir Haifa Fez "
          "Quito Cusco Recife Belem Osaka Kyoto Busan Hue Cebu Perth").split()
JOBS = ("nurse baker pilot teacher plumber chemist painter lawyer farmer dentist tailor welder florist jeweller "
        "librarian architect surgeon butcher carpenter electrician mechanic pharmacist translator journalist "
        "gardener optician potter sculptor locksmith accountant geologist firefighter paramedic veterinarian "
        "astronomer brewer cartographer choreographer economist photographer").split()


def fact(i: int) -> tuple[str, str, str]:
    """The i-th synthetic fact: (sentence, person, city); unique people for i < 1600."""
    person = f"{FIRST[i % len(FIRST)]} {LAST[(i // len(FIRST)) % len(LAST)]}"
    city = CITIES[(i * 7) % len(CITIES)]
    job = JOBS[(i * 11) % len(JOBS)]
    article = "an" if job[0] in "aeiou" else "a"
    return f"{person} lives in {city} and works as {article} {job}.", person, city


def memories_for(backend: Any, target: int) -> list[str]:
    """The longest prefix of the synthetic facts whose cartridge takes at most ``target`` tokens."""
    lo, hi = 1, 1600
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if backend.count_tokens([fact(i)[0] for i in range(mid)]) <= target:
            lo = mid
        else:
            hi = mid - 1
    return [fact(i)[0] for i in range(lo)]


def probes(num_facts: int, k: int) -> list[tuple[str, str]]:
    """``k`` (question, expected city) pairs spread evenly over the context."""
    picks = sorted({min(num_facts - 1, int((j + 0.5) * num_facts / k)) for j in range(k)})
    return [(f"Where does {fact(i)[1]} live?", fact(i)[2]) for i in picks]


def emit(result: dict[str, Any], out: str) -> None:
    """Print a benchmark's result as JSON, and write it to ``out`` too when one is given."""
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cpu_name() -> str:
    """The CPU's model name with its family and model numbers: a VM's "AMD EPYC" alone does not tell a Zen 4 (family
    25) from a Zen 5 (26), whose 512-bit FMA throughput differs by two."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or ""
    field = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[:30]) if v}
    name = field.get("model name", platform.processor() or "")
    return f"{name} (family {field['cpu family']}, model {field['model']})" if "cpu family" in field and "model" in field else name


def machine_info() -> dict[str, Any]:
    import torch
    import transformers

    cpu = cpu_name()
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return {
        "cpu": cpu, "cores": os.cpu_count(), "avx512_bf16": "avx512_bf16" in flags, "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(), "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


class Bench:
    """Runs every measurement for one context size and keeps the results."""

    def __init__(self, args: argparse.Namespace):
        from kvengine import make_backend

        self.args = args
        self.f32 = make_backend("transformers", model=args.model, dtype=args.dtype, quant="none", device=args.device)
        self.bf16 = None if args.no_bf16 or args.dtype == "bf16" else self.f32.variant(dtype="bf16")
        self.q8, self.q4 = self.f32.variant(quant="q8"), self.f32.variant(quant="q4")
        self.tmp = Path(tempfile.mkdtemp(prefix="kv_speed-"))

    def warm_up(self) -> None:
        """One small compile and answer per precision so lazy initialization is not timed."""
        for backend in filter(None, [self.f32, self.bf16]):
            c = backend.compile([fact(0)[0]])
            backend.answer(c, "Where does Ada Adler live?", max_new_tokens=2)
            backend.answer_from_text([fact(0)[0]], "Where does Ada Adler live?", max_new_tokens=2)

    def floor(self, questions: list[str]) -> dict[str, float]:
        """The question with no memory at all: TTFT and end-to-end."""
        runs = [self.f32.answer_without_memory(q, max_new_tokens=self.args.answer_tokens, stop_at_eos=False) for q in questions]
        return {"ttft_s": median([a.ttft_s for a in runs]), "e2e_s": median([a.total_s for a in runs])}

    def deepcopy_pattern(self, cartridge: Any, texts: list[str], question: str, max_new_tokens: int) -> tuple[float, float]:
        """transformers' documented reuse: deepcopy a prefilled DynamicCache, generate(); (total_s, copy_s)."""
        import torch
        from transformers import DynamicCache

        b = self.f32
        state = cartridge.payload.state
        prefilled = DynamicCache(ddp_cache_data=[tuple(t.clone() for t in state.prefix(i)) for i in range(state.num_layers)])
        ids = torch.tensor([b.layout.encode(b.layout.full_text(texts, question))], device=b.device)
        with torch.inference_mode():
            start = time.perf_counter()
            cache = copy.deepcopy(prefilled)
            copied = time.perf_counter() - start
            b.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=b.tokenizer.eos_token_id)
            total = time.perf_counter() - start
        return total, copied

    def cold_start(self, backend: Any, data: bytes, name: str) -> dict[str, float]:
        """File on disk -> ready to answer (read + verify + load), against just reading the file."""
        path = self.tmp / f"{name}.cartridge"
        path.write_bytes(data)
        reads, readies = [], []
        for _ in range(self.args.reps):
            start = time.perf_counter()
            raw = path.read_bytes()
            reads.append(time.perf_counter() - start)
            del raw
            start = time.perf_counter()
            cartridge = backend.loads(path.read_bytes())
            readies.append(time.perf_counter() - start)
            del cartridge
        path.unlink()
        return {"read_s": median(reads), "ready_s": median(readies)}

    def run_context(self, target: int, bar: Any) -> dict[str, Any]:
        a = self.args
        f32 = self.f32
        texts = memories_for(f32, target)
        qs = probes(len(texts), a.probes)
        row: dict[str, Any] = {"target_tokens": target, "num_facts": len(texts)}

        bar.set_description(f"{target}: compile f32")
        start = time.perf_counter()
        cart = f32.compile(texts)
        row["compile_f32_s"] = time.perf_counter() - start
        row["num_tokens"] = n = cart.header.num_tokens
        row["prefill_f32_tok_s"] = n / row["compile_f32_s"]
        bar.update()

        bar.set_description(f"{target}: cartridge answers")
        runs = [f32.answer(cart, q, max_new_tokens=a.answer_tokens, stop_at_eos=False) for q, _ in qs[: a.reps]]
        row["ttft_cartridge_s"] = median([r.ttft_s for r in runs])
        row["e2e_cartridge_s"] = median([r.total_s for r in runs])
        row["suffix_tokens"] = runs[0].num_prompt_tokens
        bar.update()

        bar.set_description(f"{target}: deep-copy pattern")
        pattern = [self.deepcopy_pattern(cart, texts, q, a.answer_tokens) for q, _ in qs[: a.reps]]
        row["e2e_deepcopy_s"] = median([p[0] for p in pattern])
        row["deepcopy_s"] = median([p[1] for p in pattern])
        bar.update()

        bar.set_description(f"{target}: re-reading text")
        runs = [f32.answer_from_text(texts, q, max_new_tokens=a.answer_tokens, stop_at_eos=False) for q, _ in qs[: a.text_reps]]
        row["ttft_text_s"] = median([r.ttft_s for r in runs])
        row["e2e_text_s"] = median([r.total_s for r in runs])
        bar.update()

        bar.set_description(f"{target}: sizes and cold start")
        # q8/q4 are compiled by their variant backends (shared weights), block on block over their own
        # dequantized KV: a quantized cartridge is not a byte conversion of the f32 one
        carts = {"f32": (f32, cart), "q8": (self.q8, self.q8.compile(texts)), "q4": (self.q4, self.q4.compile(texts))}
        if self.bf16 is not None:
            start = time.perf_counter()
            carts["bf16"] = (self.bf16, self.bf16.compile(texts))
            row["compile_bf16_s"] = time.perf_counter() - start
            row["prefill_bf16_tok_s"] = n / row["compile_bf16_s"]
        for name, (backend, c) in carts.items():
            data = backend.dumps(c)
            row[f"size_{name}_bytes"] = len(data)
            row[f"cold_{name}"] = self.cold_start(backend, data, name)
            del data
        for name in ("q8", "q4", "bf16"):
            if f"size_{name}_bytes" in row:
                row[f"size_{name}_ratio"] = row[f"size_{name}_bytes"] / row["size_f32_bytes"]
        bar.update()

        if self.bf16 is not None:
            bar.set_description(f"{target}: bf16 answers")
            runs = [self.bf16.answer(carts["bf16"][1], q, max_new_tokens=a.answer_tokens, stop_at_eos=False) for q, _ in qs[: a.reps]]
            row["ttft_bf16_cartridge_s"] = median([r.ttft_s for r in runs])
            row["e2e_bf16_cartridge_s"] = median([r.total_s for r in runs])
        bar.update()

        bar.set_description(f"{target}: agreement on {len(qs)} probes")
        agree = {name: 0 for name in carts if name != "f32"}
        correct = 0
        for q, city in qs:
            ref = f32.answer(cart, q, max_new_tokens=a.agree_tokens)
            correct += city.lower() in ref.text.lower()
            for name in agree:
                backend, c = carts[name]
                agree[name] += backend.answer(c, q, max_new_tokens=a.agree_tokens).token_ids == ref.token_ids
        row["num_probes"] = len(qs)
        row["agree"] = agree
        row["f32_correct"] = correct
        bar.update()
        row["ttft_ratio"] = row["ttft_text_s"] / row["ttft_cartridge_s"]
        row["e2e_vs_deepcopy"] = row["e2e_deepcopy_s"] / row["e2e_cartridge_s"]
        row["e2e_vs_text"] = row["e2e_text_s"] / row["e2e_cartridge_s"]
        return row


STEPS_PER_CONTEXT = 7


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    load_before = os.getloadavg()
    started = time.time()
    bench = Bench(args)
    bench.warm_up()
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = []
    with tqdm(total=len(contexts) * STEPS_PER_CONTEXT + 1, file=sys.stderr, unit="step") as bar:
        bar.set_description("floor (no memory)")
        floor = bench.floor([q for q, _ in probes(40, args.reps)])
        bar.update()
        for target in contexts:
            rows.append(bench.run_context(target, bar))
    for row in rows:
        row["floor_ratio"] = row["ttft_cartridge_s"] / floor["ttft_s"]
    total_probes = sum(r["num_probes"] for r in rows)
    agreement = {name: sum(r["agree"].get(name, 0) for r in rows) / total_probes for name in ("q8", "q4", "bf16") if name in rows[0]["agree"]}
    result = {
        "command": "python bench/kv_speed.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "args": vars(args), "machine": machine_info(), "load_before": load_before, "load_after": os.getloadavg(),
        "started_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), "wall_s": time.time() - started,
        "backend": bench.f32.describe().as_dict(), "floor": floor, "rows": rows, "agreement": agreement,
        "f32_accuracy": sum(r["f32_correct"] for r in rows) / total_probes, "total_probes": total_probes,
    }
    result["checks"] = checks(result)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="1000,2000,4000,8000", help="memory context sizes in tokens (default: %(default)s)")
    p.add_argument("--reps", type=int, default=5, help="runs per timing, median reported (default: %(default)s)")
    p.add_argument("--text-reps", type=int, default=2, help="runs of the slow re-reading baseline (default: %(default)s)")
    p.add_argument("--probes", type=int, default=13, help="probe questions per context for q8/q4/bf16 agreement (default: %(default)s)")
    p.add_argument("--answer-tokens", type=int, default=16, help="tokens per answer in end-to-end timings (default: %(default)s)")
    p.add_argument("--agree-tokens", type=int, default=12, help="max tokens of probe answers compared (default: %(default)s)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="model id or local directory (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: %(default)s)")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16", "bf16r"],
                   help="main precision; bf16r: bf16 matmuls and KV, f32 residual stream (default: %(default)s)")
    p.add_argument("--no-bf16", action="store_true", help="skip the bf16 comparison")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="directory for kv_speed.json/.md/.png (default: bench/results)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1k and 2k contexts, fewer repetitions and probes")
    args = p.parse_args(argv)
    if args.quick:
        args.contexts, args.reps, args.text_reps, args.probes = "1000,2000", 1, 1, 3
    if args.reps < 1 or args.text_reps < 1 or args.probes < args.reps:
        p.error("--reps and --text-reps have to be >= 1 and --probes >= --reps")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    (out / "kv_speed.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    section = markdown(result)
    (out / "kv_speed.md").write_text(section)
    chart(result, out / "kv_speed.png")
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
