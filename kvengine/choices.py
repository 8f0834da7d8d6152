"""The ``n`` sampled choices of one question, decoded together over the cartridge and the question, computed once.

The question runs once on top of the cartridge, into its scratch tail behind ``KvState.scratch()`` (as
TransformersKvBackend.answer_stream_unbatched does): its logits are every choice's first distribution. Then the
choices decode as one batch of rows: each step is ONE forward pass over ``[rows, 1]`` tokens. In every layer the
rows' queries attend over the shared prefix (the cartridge and the question: views of the KvState buffers, never
copied or expanded per row) in one kernel call, and over their own answers so far (per-row buffers
``[rows, kv_heads, max_new_tokens, head_dim]``); the two partial results are merged exactly by their log-sum-exp
(batching.py's cascade attention). Every row has its own sampling.Sampler (choice i: ``decoding.for_choice(i)``, seed
+ i), stop strings and token budget; a row that ends (end of turn, a stop string, its budget) leaves the batch and
the next pass runs without it.

Agreement with n single asks (choice i against an ask with seed + i): the first token is drawn from the very logits
the single ask computes (the same pass on the same tail) with the same generator, so it is the same. Later steps
compute the same softmax with another blocking (two partial attentions and a merge, matmuls over several rows), so
their logits agree to float rounding, not bit for bit; a draw can only differ when its uniform number falls within
that rounding of a boundary of the cumulative distribution. On SmolLM2-135M in f32 on CPU (two short memories, 3 rows,
10 steps) the logits of a batched row and of its single ask differed by at most 3.1e-5 (logits up to ~28 in size), the
first step by 0, and the choices were the same tokens (tests/kvengine/test_choices.py checks both).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .cascade import merge_states, prefix_attention_lse
from .decoding import Decoding, StopWatcher, TextStream, TokenLogprob
from .kvcache import CartridgeCache, KvState
from .sampling import Sampler


@dataclass
class Choice:
    """One decoded choice: its token ids, the stop watcher that saw its text, its log-prob entries, when it ended."""

    ids: list[int]
    watcher: StopWatcher
    logprobs: list[TokenLogprob] = field(default_factory=list)
    total_s: float = 0.0


@dataclass(eq=False)
class _Row:
    choice: Choice
    sampler: Sampler
    text: TextStream
    pending: int | None = None  # the token to feed at the next pass
    done: bool = False

    def take(self, logits: torch.Tensor, *, max_new_tokens: int, start: float) -> None:
        """Choose the next token from ``logits`` (vocab,), as decode_steps and _text_deltas do for a single ask."""
        step = self.sampler.choose(logits)
        if step is not None:
            if step.logprob is not None:
                self.choice.logprobs.append(step.logprob)
            self.text.push(step.token)
            if not self.text.stopped and len(self.choice.ids) < max_new_tokens:
                self.pending = step.token
                return
        if not self.text.stopped:
            self.text.end()  # the watcher's held text: what a single ask shows at its end
        self.pending, self.done = None, True
        self.choice.total_s = time.perf_counter() - start


class ChoicesStep:
    """Attention for one pass of the rows: kvengine.attention hands every layer's call to ``attend``."""

    def __init__(self, prefix: list[tuple[torch.Tensor, torch.Tensor]], keys: list[torch.Tensor], values: list[torch.Tensor],
                 length: int):
        self.prefix = prefix  # per layer: views [1, kv_heads, num_prefix, head_dim] of the cartridge and the question
        self.keys, self.values = keys, values  # per layer: the rows' own [rows, kv_heads, max_new_tokens, head_dim]
        self.length = length  # positions of every row's own part written before this pass (all rows have as many)

    def attend(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float | None) -> torch.Tensor:
        """Write ``key/value [rows, kv, 1, d]`` into the rows' buffers; return attention ``[rows, 1, heads, d]``."""
        layer = module.layer_idx
        rows, heads, num_new, dim = query.shape
        kv_heads = key.shape[1]
        groups = heads // kv_heads
        scale = dim**-0.5 if scaling is None else scaling
        end = self.length + num_new
        own_k, own_v = self.keys[layer], self.values[layer]
        own_k[:, :, self.length : end].copy_(key)
        own_v[:, :, self.length : end].copy_(value)
        packed = query.reshape(rows, kv_heads, groups * num_new, dim)  # query head h -> kv head h // groups
        # each row's own answer so far: every position is before the new token (num_new is 1), so no mask
        out_s, lse_s = prefix_attention_lse(packed, own_k[:, :, :end], own_v[:, :, :end], scale)
        # the shared prefix: every row's queries at once, the prefix read once for all
        prefix_k, prefix_v = self.prefix[layer]
        q = packed.transpose(0, 1).reshape(1, kv_heads, rows * groups * num_new, dim)  # (1, kv, rows * g, d)
        out_p, lse_p = prefix_attention_lse(q, prefix_k, prefix_v, scale)
        out_p = out_p.reshape(kv_heads, rows, groups * num_new, dim).transpose(0, 1)  # (rows, kv, g, d)
        lse_p = lse_p.reshape(kv_heads, rows, groups * num_new).transpose(0, 1)  # (rows, kv, g)
        out = merge_states(out_p, lse_p, out_s, lse_s.float()).to(query.dtype)  # (rows, kv, g, d)
        return out.reshape(rows, heads, num_new, dim).transpose(1, 2)  # (rows, 1, heads, d)


def decode_choices(model: Any, tokenizer: Any, state: KvState, suffix: list[int], decodings: Sequence[Decoding], *,
                   max_new_tokens: int, eos_ids: set[int], device: str, stop_at_eos: bool = True,
                   start: float | None = None, prompt: Any = None) -> tuple[list[Choice], float]:
    """Run ``suffix`` on top of ``state`` once (through ``prompt``, by default ``model``: the backend's prompt pass, as a
    single ask runs it), then decode one choice per decoding together (module docstring).

    Returns the choices, in order, and the time to the first token (seconds since ``start``)."""
    start = time.perf_counter() if start is None else start
    choices = [Choice(ids=[], watcher=StopWatcher(d.stop)) for d in decodings]
    rows = [_Row(c, Sampler(tokenizer, d, eos_ids=eos_ids, stop_at_eos=stop_at_eos), TextStream(tokenizer, c.ids, c.watcher))
            for c, d in zip(choices, decodings, strict=True)]
    num_prefix = state.num_tokens + len(suffix)
    with state.scratch(), torch.inference_mode():
        state.ensure_capacity(num_prefix)
        cache = CartridgeCache(state)
        try:
            input_ids = torch.tensor([suffix], device=device)  # (1, num_suffix)
            logits = (prompt or model)(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float()
            ttft = time.perf_counter() - start
            for row in rows:
                row.take(logits, max_new_tokens=max_new_tokens, start=start)
            live = [row for row in rows if not row.done]
            if live:
                _decode_rows(model, state, num_prefix, live, max_new_tokens=max_new_tokens, device=device, start=start)
        finally:
            cache.crop_back()  # the scratch tail is free for the next question (answer() relies on it)
    return choices, ttft


def _decode_rows(model: Any, state: KvState, num_prefix: int, live: list[_Row], *, max_new_tokens: int, device: str,
                 start: float) -> None:
    """Decode the rows in ``live`` together until each has ended; the first ``num_prefix`` positions of ``state``'s
    buffers are their shared prefix."""
    prefix = [(k[:, :, :num_prefix], v[:, :, :num_prefix]) for k, v in zip(state.keys, state.values, strict=True)]
    keys = [torch.empty((len(live), k.shape[1], max_new_tokens, k.shape[-1]), dtype=k.dtype, device=k.device) for k in state.keys]
    values = [torch.empty((len(live), v.shape[1], max_new_tokens, v.shape[-1]), dtype=v.dtype, device=v.device) for v in state.values]
    base, head = model.base_model, model.get_output_embeddings()
    length = 0
    while live:
        step = ChoicesStep(prefix, keys, values, length)
        input_ids = torch.tensor([[row.pending] for row in live], device=device)  # (rows, 1)
        position_ids = torch.full((len(live), 1), num_prefix + length, device=device)  # (rows, 1)
        hidden = base(input_ids=input_ids, position_ids=position_ids, use_cache=False, mnesio_cascade=step).last_hidden_state
        logits = head(hidden[:, -1]).float()  # (rows, vocab)
        length += 1
        for row, row_logits in zip(live, logits, strict=True):
            row.take(row_logits, max_new_tokens=max_new_tokens, start=start)
        kept = [i for i, row in enumerate(live) if not row.done]
        if len(kept) < len(live):  # ended rows leave the batch: the next pass runs without them
            index = torch.tensor(kept, dtype=torch.long, device=keys[0].device)
            keys = [k.index_select(0, index) for k in keys]
            values = [v.index_select(0, index) for v in values]
            live = [live[i] for i in kept]
