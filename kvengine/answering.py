"""Answering on TransformersKvBackend: the question (or conversation) fed on top of a cartridge and decoded.

A mixin of TransformersKvBackend (transformers_backend.py holds the model, compile and the cartridge bytes): the
batched greedy path (batching.py), the one-at-a-time path, sampling and the other decoding options
(decoding.py, sampling.py), the n choices of one question decoded together (choices.py), stop strings, and re-reading the memories as text (the baseline). Thread safety is
the backend's (its module docstring).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch
from transformers import DynamicCache

from .base import Answer, Cartridge
from .batching import MAX_ROW_ROOM, Batcher
from .choices import decode_choices
from .conversation import Prompt
from .decoding import GREEDY, Decoding, StopWatcher, TextStream, TokenLogprob
from .errors import ConfigError
from .format import (
    check_compatible,
)
from .kvcache import CartridgeCache, KvState
from .native_pass import NativePass
from .sampling import decode_steps


class AnsweringMixin:
    """TransformersKvBackend's answer paths (they use its model, tokenizer, layout and batcher)."""

    def answer(self, cartridge: Cartridge, question: Prompt, *, max_new_tokens: int = 32, decoding: Decoding | None = None,
               stop_at_eos: bool = True) -> Answer:
        """Feed only the question suffix on top of the cartridge, decode (greedily by default), crop back.

        ``stop_at_eos=False`` always decodes ``max_new_tokens`` tokens (benchmarks compare equal lengths).
        """
        *_, answer = self.answer_stream(cartridge, question, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos,
                                        decoding=decoding)
        return answer

    def answer_stream(
        self, cartridge: Cartridge, question: Prompt, *, max_new_tokens: int = 32, decoding: Decoding | None = None,
        stop_at_eos: bool = True,
    ) -> Iterator[str | Answer]:
        """answer(), yielding a text delta per decoded token (a token that ends inside a UTF-8 character waits
        for the next one), then the Answer. Decoded in the model's batch with every other question in flight
        (batching.py); raises OverloadedError when too many questions already wait. The question's batch row is
        held until the generator ends or is closed: a client that stops reading must close it (the web tier
        does, in ``finally``). A ``decoding`` that needs each step's distribution (decoding.py) is decoded one at a
        time (answer_stream_unbatched); stop strings end the text on either path."""
        start = time.perf_counter()
        decoding = decoding or GREEDY
        check_compatible(cartridge.header, self._description)
        state = self._payload(cartridge).state
        suffix = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question)))
        self._check_room(state.num_tokens + len(suffix), max_new_tokens, "memories plus the question and answer")
        if decoding.per_step or len(suffix) + max_new_tokens > MAX_ROW_ROOM:  # batching.MAX_ROW_ROOM: too long for a row
            yield from self.answer_stream_unbatched(cartridge, question, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos,
                                                    decoding=decoding)
            return
        watcher = StopWatcher(decoding.stop)
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
            yield from self._text_deltas(tokens(), ids, watcher)
        finally:
            request.cancel()  # frees the row now if the caller stopped reading (a no-op after "end")
        yield self._answer(ids, "cartridge", state.num_tokens, len(suffix), ttft, time.perf_counter() - start,
                           watcher=watcher, max_new_tokens=max_new_tokens)

    def answer_choices(self, cartridge: Cartridge, question: Prompt, *, num_choices: int, max_new_tokens: int = 32,
                       decoding: Decoding | None = None, stop_at_eos: bool = True) -> list[Answer]:
        """``num_choices`` answers of ``question`` (KvBackend.answer_choices). Greedy: one decode, every choice. Sampled:
        the question computed once on top of the cartridge, then the choices decoded together as a batch of rows over
        that shared prefix, each with its own sampler (choice i: seed + i), stops and budget (choices.py)."""
        decoding = decoding or GREEDY
        if isinstance(num_choices, bool) or not isinstance(num_choices, int) or num_choices < 1:
            raise ConfigError(f"`num_choices` has to be a whole number >= 1 but got {num_choices!r}")
        if decoding.temperature <= 0 or num_choices == 1:  # argmax is deterministic: n decodes would be n copies
            return [self.answer(cartridge, question, max_new_tokens=max_new_tokens, decoding=decoding,
                                stop_at_eos=stop_at_eos)] * num_choices
        start = time.perf_counter()
        check_compatible(cartridge.header, self._description)
        state = self._payload(cartridge).state
        suffix = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question)))
        self._check_room(state.num_tokens + len(suffix), max_new_tokens, "memories plus the question and answer")
        choices, ttft = decode_choices(
            self.model, self.tokenizer, state, suffix, [decoding.for_choice(i) for i in range(num_choices)],
            max_new_tokens=max_new_tokens, eos_ids=self._eos_ids, device=self.device, stop_at_eos=stop_at_eos, start=start,
            prompt=self._prompt_pass,
        )
        return [self._answer(c.ids, "cartridge", state.num_tokens, len(suffix), ttft, c.total_s, watcher=c.watcher,
                             max_new_tokens=max_new_tokens, logprobs=c.logprobs) for c in choices]

    def batcher(self) -> Batcher:
        """The model's batcher (made on first use; its worker thread starts with the first question)."""
        box = self._batching
        with box["lock"]:
            if box["batcher"] is None:
                box["batcher"] = Batcher(self.model, eos_ids=self._eos_ids, device=self.device, max_batch=self.max_batch,
                                         max_waiting=self.max_waiting, step=self._decode_step,
                                         prompt=self._prompt_pass)
            return box["batcher"]

    def answer_unbatched(self, cartridge: Cartridge, question: Prompt, *, max_new_tokens: int = 32, stop_at_eos: bool = True,
                         decoding: Decoding | None = None) -> Answer:
        """answer() one question at a time behind the cartridge's lock (the path before batching; benches compare)."""
        *_, answer = self.answer_stream_unbatched(cartridge, question, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos,
                                                  decoding=decoding)
        return answer

    def answer_stream_unbatched(
        self, cartridge: Cartridge, question: Prompt, *, max_new_tokens: int = 32, stop_at_eos: bool = True,
        decoding: Decoding | None = None,
    ) -> Iterator[str | Answer]:
        """answer_stream() one question at a time behind the cartridge's lock: a delta per decoded token, then the
        Answer. The cartridge's scratch tail is held until the generator ends or is closed."""
        start = time.perf_counter()
        decoding = decoding or GREEDY
        watcher, logprobs = StopWatcher(decoding.stop), []
        check_compatible(cartridge.header, self._description)
        state = self._payload(cartridge).state
        suffix = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question)))
        num_cached = state.num_tokens
        self._check_room(num_cached + len(suffix), max_new_tokens, "memories plus the question and answer")
        ids: list[int] = []
        with state.scratch(), torch.inference_mode():
            state.ensure_capacity(num_cached + len(suffix) + max_new_tokens)
            cache = CartridgeCache(state)
            try:
                if decoding.per_step:
                    timing: dict[str, float] = {}
                    tokens = _timed(self._step_tokens(suffix, cache, max_new_tokens, decoding, logprobs, stop_at_eos=stop_at_eos),
                                    start, timing)
                    yield from self._text_deltas(tokens, ids, watcher)
                    ttft = timing.get("ttft", time.perf_counter() - start)  # no token at all: the prompt's pass was all
                else:
                    tokens = self._greedy_tokens(suffix, cache, max_new_tokens, stop_at_eos=stop_at_eos)
                    _first = next(tokens)  # the prompt's pass: first-token log-probs
                    ttft = time.perf_counter() - start
                    yield from self._text_deltas(tokens, ids, watcher)
            finally:
                cache.crop_back()  # the scratch tail is free for the next question (answer() relies on it)
        yield self._answer(ids, "cartridge", num_cached, len(suffix), ttft, time.perf_counter() - start, watcher=watcher,
                           max_new_tokens=max_new_tokens, logprobs=logprobs)

    def _step_tokens(self, ids: list[int], cache, max_new_tokens: int, decoding: Decoding, logprobs: list[TokenLogprob],
                     *, stop_at_eos: bool = True) -> Iterator[int]:
        """sampling.decode_steps' token ids, collecting their log-prob entries into ``logprobs``."""
        for step in decode_steps(self._prompt_pass, self.tokenizer, ids, cache, max_new_tokens=max_new_tokens, decoding=decoding,
                                 eos_ids=self._eos_ids, device=self.device, stop_at_eos=stop_at_eos, forward=self._step_over(cache)):
            if step.logprob is not None:
                logprobs.append(step.logprob)
            yield step.token

    def _text_deltas(self, tokens: Iterator[int], ids: list[int], watcher: StopWatcher | None = None) -> Iterator[str]:
        """Decode ``tokens`` as they come, appending each to ``ids``: yield the text each one adds (decoding.TextStream),
        then what the last tokens completed. With ``watcher``, the text ends before its first stop string (no more
        tokens are taken)."""
        text = TextStream(self.tokenizer, ids, watcher)
        for token in tokens:
            if delta := text.push(token):
                yield delta
            if text.stopped:
                return
        if tail := text.end():
            yield tail

    def answer_from_text(self, texts: Sequence[str], question: Prompt, *, max_new_tokens: int = 32,
                         decoding: Decoding | None = None, stop_at_eos: bool = True) -> Answer:
        """Re-read the whole prompt (memories + question or conversation) for this one question: the baseline."""
        if decoding is not None and decoding != GREEDY:
            return self._answer_from_text_decoded(texts, question, max_new_tokens=max_new_tokens, decoding=decoding)
        start = time.perf_counter()
        layout = self.layout
        memories = layout.clean_memories(texts)
        ids = layout.encode(layout.full_text(memories, layout.clean_question(question)))
        num_context = len(layout.encode(layout.prefix_text(memories)))
        self._check_room(len(ids), max_new_tokens, "memories plus the question and answer")
        with torch.inference_mode():
            out, _, ttft = self._greedy(ids, None, max_new_tokens, start, stop_at_eos=stop_at_eos)
        return self._answer(out, "text", num_context, len(ids), ttft, time.perf_counter() - start)

    def _answer_from_text_decoded(self, texts: Sequence[str], question: Prompt, *, max_new_tokens: int, decoding: Decoding) -> Answer:
        """answer_from_text() under a non-default ``decoding`` (on a plain cache; stop strings as on the cartridge path)."""
        start = time.perf_counter()
        layout = self.layout
        memories = layout.clean_memories(texts)
        prompt = layout.encode(layout.full_text(memories, layout.clean_question(question)))
        self._check_room(len(prompt), max_new_tokens, "memories plus the question and answer")
        watcher, logprobs, ids = StopWatcher(decoding.stop), [], []
        with torch.inference_mode():
            cache = self._fresh_cache(len(prompt) + max_new_tokens)
            if decoding.per_step:
                tokens = self._step_tokens(prompt, cache, max_new_tokens, decoding, logprobs)
            else:
                tokens = self._greedy_tokens(prompt, cache, max_new_tokens)
                next(tokens)
            for _ in self._text_deltas(tokens, ids, watcher):
                pass
        num_context = len(layout.encode(layout.prefix_text(memories)))
        return self._answer(ids, "text", num_context, len(prompt), 0.0, time.perf_counter() - start, watcher=watcher,
                            max_new_tokens=max_new_tokens, logprobs=logprobs)

    def answer_without_memory(self, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """Answer with no memories at all (the model's default system turn): the speed floor."""
        start = time.perf_counter()
        ids = self.layout.encode(self.layout.no_memory_text(self.layout.clean_question(question)))
        self._check_room(len(ids), max_new_tokens, "question and answer")
        with torch.inference_mode():
            out, _, ttft = self._greedy(ids, None, max_new_tokens, start, stop_at_eos=stop_at_eos)
        return self._answer(out, "none", 0, len(ids), ttft, time.perf_counter() - start)

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
            cache = self._fresh_cache(len(ids) + max_new_tokens)
        step = self._step_over(cache)
        input_ids = torch.tensor([ids], device=self.device)  # (1, num_ids)
        logits = self._prompt_pass(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float()  # (vocab,)
        yield torch.log_softmax(logits, dim=-1)
        token = int(logits.argmax())
        num_out = 0
        while (not stop_at_eos or token not in self._eos_ids) and num_out < max_new_tokens:
            yield token
            num_out += 1
            if num_out == max_new_tokens:
                break
            input_ids = torch.tensor([[token]], device=self.device)  # (1, 1)
            logits = step(input_ids=input_ids, cache=cache, use_cache=True).logits[0, -1].float()
            token = int(logits.argmax())

    def _fresh_cache(self, num_positions: int) -> DynamicCache:
        """An empty cache for re-reading: transformers' own, or under a compiled step (compile_step) a CartridgeCache over
        empty buffers of ``num_positions``, so the re-reading decodes through the very compiled step a cartridge does."""
        if not self.compile_step and not isinstance(self._decode_step, NativePass):
            return DynamicCache(config=self.model.config)
        num_layers = self.model.config.get_text_config().num_hidden_layers
        return CartridgeCache(KvState.blank(num_layers, self.kv_shape, capacity=num_positions, dtype=self.torch_dtype,
                                            device=self.device))

    @property
    def _prompt_pass(self):
        """What runs a prompt's pass: the decoder's pass in one call where it serves (it hands a pass it does not take
        to the model), else the model (the compiled step takes single tokens only)."""
        return self._decode_step if isinstance(self._decode_step, NativePass) else self.model

    def _step_over(self, cache):
        """What runs a single-token step on ``cache``: the compiled step takes a CartridgeCache only (compiled.py)."""
        return self._decode_step if isinstance(cache, CartridgeCache) else self.model

    def _answer(self, ids: list[int], mode: str, num_context: int, num_prompt: int, ttft: float, total: float, *,
                watcher: StopWatcher | None = None, max_new_tokens: int | None = None, logprobs: Sequence[TokenLogprob] = ()) -> Answer:
        hit = watcher is not None and watcher.hit
        text = (watcher.text if hit else self.tokenizer.decode(ids, skip_special_tokens=True)).strip()
        finish = "length" if not hit and max_new_tokens is not None and len(ids) >= max_new_tokens else "stop"
        return Answer(text=text, token_ids=tuple(ids), mode=mode, num_context_tokens=num_context, num_prompt_tokens=num_prompt,
                      ttft_s=ttft, total_s=total, finish_reason=finish, logprobs=tuple(logprobs))


def _timed(tokens: Iterator[int], start: float, timing: dict[str, float]) -> Iterator[int]:
    """Pass ``tokens`` on, noting in ``timing["ttft"]`` when the first one came (seconds since ``start``)."""
    for token in tokens:
        timing.setdefault("ttft", time.perf_counter() - start)
        yield token
