"""Continuous batching of cartridge questions with cascade (shared-prefix) attention.

Why: decoding is memory-bandwidth bound. One decoding step reads every weight and, for a cartridge question,
the cartridge's whole KV state (46 KB per token in f32 on SmolLM2-135M: 370 MB at 8k tokens). Questions taking
turns behind ``KvState.lock`` read all of it once per token per question. Here one forward pass per step
serves every question in flight, so the weights and each cartridge's prefix are read once per step for all.

Design
------
- **One Batcher per loaded model** (TransformersKvBackend makes it lazily). A daemon worker thread owns the
  model's forward passes for batched questions; callers (any thread) ``submit()`` and then read their
  ``Request``'s event queue: ``("token", id)`` per decoded token, then ``("end", None)`` or ``("error", exc)``.
- **Continuous batching.** Between steps the worker admits waiting questions (up to ``max_batch`` rows in
  flight) and drops rows that finished (EOS / ``max_new_tokens``) or whose caller cancelled (closed its
  stream). Newly admitted questions are prefilled together in one pass of their own (their prompts padded to
  the longest; padding positions are masked out and later overwritten), which yields their first tokens; then
  they join the decode batch, where every step is ONE forward pass over ``[rows, 1]`` tokens.
- **A burst shares its first pass.** A worker that was idle (nothing in flight, nothing waiting), woken by a
  question, first waits until no other question has come for ``gather_s`` (5 ms; at most 8 times that in all), as
  dynamic batchers' queue delay does:
  questions sent together otherwise split into a pass for the first few and a pass for the rest.
- **Prefill first.** Questions that arrive while a prefill pass runs are prefilled right after it, before the next
  decoding step (as vLLM's scheduler does), so a burst's late arrivals wait for one pass, not a pass and a step; at
  most two prefill passes run in a row (MAX_PREFILLS_IN_A_ROW), so a row already decoding waits at most two passes
  for its next token.
- **Cascade attention, no prefix copies.** A cartridge's KV state (KvState's read-only region) is shared by all
  of its rows and is never copied or expanded per row. Each row has its own scratch (the question's prompt and
  answer tokens) in per-row slot buffers ``[max_batch, kv_heads, room, head_dim]`` per layer. In every layer,
  for each cartridge in the batch, the queries of all its rows (every query head, packed onto its key/value
  head, GQA) attend over the prefix in ONE kernel call that returns the output and its log-sum-exp (LSE); each
  row's queries attend over its own suffix (masked by its length and causally); the two partial results are
  merged exactly: ``lse = logaddexp(lse_p, lse_s)``, ``out = out_p * exp(lse_p - lse) + out_s * exp(lse_s - lse)``
  (FlashInfer's merge_state, Hydragen's prefix/suffix split). This is the same softmax over the concatenated
  keys, so results agree with one-at-a-time decoding to float rounding (tests/kvengine/test_batching.py).
  Rows of different cartridges of the same model share the weights' pass: the prefix part runs once per
  cartridge group, the rest of the step (projections, MLP, suffix attention) once for the whole batch.
- **How the model is driven.** The base model runs with ``cache=None`` and an extra ``mnesio_cascade``
  keyword, which transformers passes through to every attention call; kvengine.attention's ``mnesio_sdpa``
  hands such calls to ``CascadeStep.attend`` (it writes the new keys/values into the row buffers and computes
  the attention above). Positions are given explicitly per row (cartridge length + the row's suffix position),
  so rotary embeddings match the one-at-a-time path. The LM head runs only on each row's last real token.
- **Prefix kernel with LSE.** CPU: aten's fused flash kernel (``_scaled_dot_product_flash_attention_for_cpu``),
  which returns the LSE and reads strided views (the prefix is a view of the KvState buffers). CUDA: aten's
  flash kernel (bf16/f16) or memory-efficient kernel. The rows' own parts (a few dozen positions each) go
  through the CPU flash kernel with an additive per-row mask, elsewhere through plain math. Each kernel is
  checked once per (device, dtype) against plain math on a small random input; one that is missing or
  disagrees is replaced by the plain math (scores, logsumexp, softmax @ V), exact but materializing the
  scores. Kernel calls per layer are kept few (the merge is one sigmoid and one lerp): on a CPU, a small
  model's decoding step spends on per-call overhead what it does not spend in the weight matmuls.
- **A lone question runs as the one-at-a-time path does.** With one row in the batch, cascade attention is two
  kernel calls and a merge per layer where the one-at-a-time path makes one call over the cartridge and its scratch
  tail together: a lone question took 1.13x the one-at-a-time time at 8k on a 2-core CPU (bench/lone_question_ab.py),
  against issue 14's "no slower than today". So a
  question admitted into an empty batch takes its cartridge's scratch tail (``KvState.lock``, tried without waiting:
  if the one-at-a-time path holds it, the row takes the cascade path) and runs the very passes of
  ``TransformersKvBackend._greedy_tokens``: the same tokens, bit for bit, at the same cost. When another question
  joins, the lone row's scratch (its prompt and answer so far, a few dozen positions) is copied into its slot before
  the next decoding step, the tail is given back, and the row decodes in the batch from then on. A one-at-a-time
  call on the same cartridge (a fidelity check, a long question) takes the tail through ``KvState.scratch()``, which
  marks that it waits: the lone row moves into its slot at its next decoding step, so the call waits for the pass in
  progress (and a prefill pass that runs first), not for a whole answer, and no new lone row takes the tail while it
  waits. A lone question that would need the cartridge's buffers grown (its prompt and answer past the KvState's
  spare room) takes the cascade path: the worker never copies a cartridge.
- **Long questions** (prompt + answer over MAX_ROW_ROOM positions) are not batched: every slot would grow to
  their length. The backend answers them one at a time (answer_stream_unbatched), as before batching.
- **Back-pressure.** At most ``max_waiting`` questions wait for a row; past that, ``submit()`` raises
  OverloadedError with a retry hint from the recent per-question time, instead of queueing without bound.
- **Thread safety.** Only the worker thread runs batched forward passes and touches the row buffers. The
  waiting queue and the row list's admission are guarded by one condition variable. The model is read-only
  under ``torch.inference_mode()``; the cartridge prefix is read-only, so the one-at-a-time path
  (fidelity(), answer_stream_unbatched()) may run on the same cartridge at the same time (it writes only the
  KvState's scratch tail, which the batcher uses only for a lone row, holding the KvState's lock). A caller that
  stops reading calls ``cancel()`` (answer_stream does in ``finally``); its row leaves at the next step boundary. An error in a pass is
  delivered to every row of that pass, and the worker carries on with later questions.
"""
from __future__ import annotations

import collections
import math
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .errors import OverloadedError
from .kvcache import CartridgeCache, KvState

DEFAULT_MAX_BATCH = 16  # rows decoded together
DEFAULT_MAX_WAITING = 64  # questions waiting for a row before OverloadedError
# An idle worker woken by a question waits until no other question has come for this long (at most GATHER_CAP times
# it), so a burst shares its first pass. 5 ms is CPython's default GIL switch interval: a thread that is ready to
# submit may wait that long to run. A lone question pays it once (0.005 s of a 0.2 s first token at 8k).
DEFAULT_GATHER_S = 0.005
GATHER_CAP = 8
# Prefill passes run in a row before the rows already decoding get their next token (prefill first, below): a
# burst split at a pass boundary gets its second pass at once, and no decoding row waits more than two passes.
MAX_PREFILLS_IN_A_ROW = 2
INITIAL_ROOM = 128  # per-row scratch positions; grown (one copy) when a question needs more
# The most scratch positions (prompt + answer) a question may take in a batch row. Every row slot has the
# room of the longest, so one long question would make all max_batch slots long (16 x 4k positions are 2.9 GB
# in f32 on SmolLM2); longer questions take the one-at-a-time path instead (TransformersKvBackend).
MAX_ROW_ROOM = 1024


# -- attention pieces --------------------------------------------------------------------------------
def plain_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q [b, h, m, d]`` over ``k, v [b, h, n, d]`` (an optional additive float mask): output and LSE (float32)."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale  # [b, h, m, n]
    if mask is not None:
        scores = scores + mask
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)).to(v.dtype), v)
    return out, lse


def _cpu_flash(q, k, v, scale):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=None, scale=scale)
    return out, lse


def _cpu_flash_masked(q, k, v, scale, mask=None):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
    return out, lse


def _cuda_flash(q, k, v, scale):
    result = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
    return result[0], result[1][..., : q.shape[-2]]


def _cuda_efficient(q, k, v, scale):
    result = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False, scale=scale)
    return result[0], result[1][..., : q.shape[-2]]  # the LSE may be padded to a multiple of 32 rows


_KERNELS: dict[tuple[str, torch.dtype, bool], object] = {}
_KERNELS_LOCK = threading.Lock()


def _choose_kernel(device: torch.device, dtype: torch.dtype, *, masked: bool = False):
    """The first fused kernel that exists and agrees with plain math here (checked once), else plain math.

    ``masked``: the kernel for the rows' own parts (an additive mask per row); only the CPU flash kernel takes one.
    """
    key = (device.type, dtype, masked)
    with _KERNELS_LOCK:
        if key in _KERNELS:
            return _KERNELS[key]
        if masked:
            candidates = [_cpu_flash_masked] if device.type == "cpu" else []
        else:
            candidates = [_cpu_flash] if device.type == "cpu" else [_cuda_flash, _cuda_efficient] if device.type == "cuda" else []
        gen = torch.Generator(device="cpu").manual_seed(0)
        b = 3 if masked else 1
        q, k, v = (torch.randn(b, 2, m, 64, generator=gen).to(device=device, dtype=dtype) for m in (7, 300, 300))
        k_view = torch.cat([k, k[:, :, :20]], dim=2)[:, :, :300]  # strided, like a KvState prefix view
        mask = torch.zeros(b, 1, 7, 300, dtype=dtype, device=device)
        if masked:
            mask[0, :, :, 100:] = float("-inf")
            mask[2, :, :, 5:] = float("-inf")
        want_out, want_lse = plain_attention_lse(q.float(), k.float(), v.float(), 0.125, mask.float() if masked else None)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        chosen = plain_attention_lse
        for kernel in candidates:
            try:
                out, lse = kernel(q, k_view, v, 0.125, mask) if masked else kernel(q, k_view, v, 0.125)
            except Exception:  # noqa: BLE001 - a kernel this build or device lacks: try the next
                continue
            if out.shape == want_out.shape and torch.allclose(out.float(), want_out, atol=tol) and torch.allclose(lse.float(), want_lse, atol=tol):
                chosen = kernel
                break
        _KERNELS[key] = chosen
        return chosen


def prefix_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention of ``q [1, h, m, d]`` over a whole prefix ``k, v [1, h, n, d]`` (views, not copied).

    Returns the output ``[1, h, m, d]`` and the natural-log LSE ``[1, h, m]`` in float32.
    """
    kernel = _choose_kernel(q.device, q.dtype)
    out, lse = kernel(q, k, v, scale)
    return out, lse.float()


def suffix_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q [b, h, m, d]`` over ``k, v [b, h, S, d]`` under the additive ``mask [b, 1, m, S]``.

    Every query row must see at least one key (a token always sees itself). CPU: the fused flash kernel (one call);
    elsewhere plain math. Returns the output and the LSE (float32).
    """
    if _choose_kernel(q.device, q.dtype, masked=True) is _cpu_flash_masked:
        out, lse = _cpu_flash_masked(q, k, v, scale, mask)
        return out, lse.float()
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse.unsqueeze(-1)).to(v.dtype), v), lse


def merge_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Exact softmax merge of two attention partials over disjoint key sets (lse float32 ``[..., m]``).

    ``out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)`` with ``lse = logaddexp(lse_a, lse_b)``; the weight
    of ``a`` is ``sigmoid(lse_a - lse_b)``, so this is one lerp (three kernel calls instead of eight: per layer
    and step, call overhead is what a CPU decode step of a small model spends beyond the matmuls).
    """
    weight = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)
    if out_a.dtype != torch.float32:
        out_a, out_b = out_a.float(), out_b.float()
    return torch.lerp(out_b, out_a, weight)


# -- requests and rows ----------------------------------------------------------------------------------
@dataclass(eq=False)
class Request:
    """One submitted question; the caller reads ``events()``; ``cancel()`` frees its row (or its queue place)."""

    state: KvState
    prompt: list[int]  # the question suffix's token ids (run on top of the cartridge)
    max_new_tokens: int
    stop_at_eos: bool
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    _events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _batcher: Batcher | None = None

    def events(self) -> Iterator[tuple[str, object]]:
        """``("token", id)`` per decoded token, then ``("end", None)``; an ``("error", exc)`` is raised here."""
        while True:
            kind, value = self._events.get()
            if kind == "error":
                raise value
            yield kind, value
            if kind == "end":
                return

    def cancel(self) -> None:
        """Stop decoding this question (idempotent): it leaves the queue now, or its row at the next step."""
        self.cancelled = True
        if self._batcher is not None:
            self._batcher._forget(self)

    def _put(self, kind: str, value: object = None) -> None:
        self._events.put((kind, value))


@dataclass(eq=False)
class _Row:
    request: Request
    length: int = 0  # positions of the row's scratch written so far
    pending: int | None = None  # the token to feed at the next decode step
    num_out: int = 0
    done: bool = False
    # A row alone in the batch runs as the one-at-a-time path does (module docstring, "A lone question"): its scratch
    # is this cache over its cartridge's own tail, whose lock the row holds until it moves to its slot or ends.
    solo: CartridgeCache | None = None


# -- one forward pass ---------------------------------------------------------------------------------
class CascadeStep:
    """What attention needs for one batched pass: the rows (slots ``start:start+b``), their lengths, their cartridges.

    ``attend`` is called by kvengine.attention for every layer of the pass (module docstring).
    """

    def __init__(self, batcher: Batcher, start: int, rows: list[_Row], num_new: int):
        device = batcher.device
        self.batcher, self.start, self.stop = batcher, start, start + len(rows)
        self.num_new = num_new
        self.past = torch.tensor([row.length for row in rows], device=device)  # [b]
        self.max_len = max(row.length for row in rows) + num_new
        groups: dict[int, tuple[KvState, list[int]]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(id(row.request.state), (row.request.state, []))[1].append(i)
        self.groups = [
            (state, slice(idx[0], idx[-1] + 1) if idx == list(range(idx[0], idx[-1] + 1)) else torch.tensor(idx, device=device))
            for state, idx in groups.values()
        ]
        self.write_pos = self.past.unsqueeze(1) + torch.arange(num_new, device=device)  # [b, n]
        self._masks: dict[int, torch.Tensor] = {}

    def _suffix_mask(self, groups: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive ``[b, 1, groups * n, S]``: packed query row r (token t = r % n) sees suffix positions <= past + t."""
        if (groups, dtype) not in self._masks:
            device = self.past.device
            t = torch.arange(groups * self.num_new, device=device) % self.num_new
            j = torch.arange(self.max_len, device=device)
            allowed = j.view(1, 1, 1, -1) <= (self.past.view(-1, 1, 1, 1) + t.view(1, 1, -1, 1))
            mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
            self._masks[(groups, dtype)] = mask
        return self._masks[(groups, dtype)]

    def attend(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None) -> torch.Tensor:
        """Write ``key/value [b, kv, n, d]`` into the rows' scratch; return attention ``[b, n, heads, d]``."""
        layer = module.layer_idx
        b, heads, n, dim = query.shape
        kv_heads = key.shape[1]
        groups = heads // kv_heads
        scale = dim**-0.5 if scaling is None else scaling
        kbuf = self.batcher.kbuf[layer][self.start : self.stop]  # [b, kv, room, d] views of the slot buffers
        vbuf = self.batcher.vbuf[layer][self.start : self.stop]
        index = self.write_pos.view(b, 1, n, 1)  # scatter_, not index_put: the latter costs milliseconds here
        kbuf.scatter_(2, index.expand(b, kv_heads, n, key.shape[-1]), key)
        vbuf.scatter_(2, index.expand(b, kv_heads, n, value.shape[-1]), value)
        packed = query.reshape(b, kv_heads, groups * n, dim)  # query head h -> kv head h // groups; row gi * n + t
        # each row's own part: the question's prompt and answer so far, masked by its length and causally
        out_s, lse_s = suffix_attention_lse(packed, kbuf[:, :, : self.max_len], vbuf[:, :, : self.max_len],
                                            self._suffix_mask(groups, query.dtype), scale)
        # the shared part: per cartridge, all its rows' queries against its prefix at once, the prefix read once
        if len(self.groups) == 1:
            state, _ = self.groups[0]
            out_p, lse_p = self._prefix(packed, state, layer, scale)
        else:
            out_p, lse_p = torch.empty_like(out_s), torch.empty_like(lse_s)
            for state, rows in self.groups:
                out_p[rows], lse_p[rows] = self._prefix(packed[rows], state, layer, scale)
        out = merge_states(out_p, lse_p, out_s, lse_s).to(query.dtype)  # [b, kv, g*n, d]
        return out.reshape(b, heads, n, dim).transpose(1, 2)  # [b, n, heads, d]; the caller's reshape copies

    @staticmethod
    def _prefix(packed: torch.Tensor, state: KvState, layer: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of rows' packed queries ``[k, kv, m, d]`` over ``state``'s prefix, in one kernel call."""
        k, kv_heads, m, dim = packed.shape
        q = packed.transpose(0, 1).reshape(1, kv_heads, k * m, dim)  # all rows' queries per kv head
        prefix_k, prefix_v = state.prefix(layer)  # [1, kv, N, d] views of the cartridge: never copied
        out, lse = prefix_attention_lse(q, prefix_k, prefix_v, scale)
        return out.reshape(kv_heads, k, m, dim).transpose(0, 1), lse.reshape(kv_heads, k, m).transpose(0, 1)


# -- the batcher ---------------------------------------------------------------------------------------
class Batcher:
    """Decodes concurrently submitted questions of one model together (module docstring)."""

    def __init__(self, model: torch.nn.Module, *, eos_ids: set[int], device: str, max_batch: int = DEFAULT_MAX_BATCH,
                 max_waiting: int = DEFAULT_MAX_WAITING, gather_s: float = DEFAULT_GATHER_S):
        if max_batch < 1 or max_waiting < 0 or not gather_s >= 0:
            raise ValueError(f"max_batch has to be >= 1, max_waiting >= 0 and gather_s >= 0 but got {max_batch}, {max_waiting} and {gather_s}")
        self.model, self.eos_ids, self.device = model, set(eos_ids), torch.device(device)
        self.max_batch, self.max_waiting, self.gather_s = max_batch, max_waiting, gather_s
        self.base = getattr(model, "base_model", None)  # the decoder stack, without the LM head
        self.lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        self.kbuf: list[torch.Tensor] = []
        self.vbuf: list[torch.Tensor] = []
        self.room = 0
        self._waiting: collections.deque[Request] = collections.deque()
        self._rows: list[_Row] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._in_flight = 0  # rows admitted and not yet dropped (guarded by _cond)
        self._seconds_per_question = 1.0  # moving average of recent total answer times (retry hint)
        self.steps = 0  # forward passes run (decode steps and prefill passes), for tests and benches
        self.max_rows_seen = 0

    # -- callers' side --------------------------------------------------------------------------------
    def submit(self, state: KvState, prompt: list[int], *, max_new_tokens: int, stop_at_eos: bool = True) -> Request:
        """Queue a question; raise OverloadedError when ``max_waiting`` questions already wait for a row."""
        if len(prompt) + max_new_tokens > MAX_ROW_ROOM:
            raise ValueError(f"a batched question takes at most {MAX_ROW_ROOM} positions (prompt + answer); answer it alone")
        request = Request(state=state, prompt=list(prompt), max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)
        request._batcher = self
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            free_rows = self.max_batch - self._in_flight  # the worker admits these at its next step boundary
            if len(self._waiting) >= self.max_waiting + max(0, free_rows):
                waiting = len(self._waiting)
                retry = max(1.0, math.ceil((waiting / self.max_batch + 1) * self._seconds_per_question))
                raise OverloadedError(waiting=waiting, limit=self.max_waiting, retry_after_s=float(retry))
            self._waiting.append(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvengine-batcher", daemon=True)
                self._thread.start()
            self._cond.notify()
        return request

    def waiting(self) -> int:
        """Questions submitted and not yet in the batch."""
        with self._cond:
            return len(self._waiting)

    def close(self) -> None:
        """Stop the worker after the current step; questions still waiting get an error."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _forget(self, request: Request) -> None:
        with self._cond:
            try:
                self._waiting.remove(request)
            except ValueError:
                pass  # already in the batch: the worker drops its row at the next step

    # -- the worker -------------------------------------------------------------------------------------
    def _can_admit(self) -> bool:
        """Whether a question waits and a row is free for it."""
        with self._cond:
            return bool(self._waiting) and len(self._rows) < self.max_batch

    def _gather(self) -> None:
        """Idle and woken: wait (holding ``_cond``'s lock only between waits) until no question came for gather_s."""
        deadline = time.monotonic() + GATHER_CAP * self.gather_s
        while self.gather_s and not self._closed and len(self._waiting) < self.max_batch:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            seen = len(self._waiting)
            self._cond.wait(min(self.gather_s, left))  # submit() notifies: a new question restarts the quiet period
            if len(self._waiting) <= seen:  # none came (a cancelled one leaves the queue: no reason to wait on)
                return

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # no pass caught it: the worker is gone, so every caller hears, and none waits on
            with self._cond:
                self._closed = True
                stranded = [*self._waiting, *(row.request for row in self._rows)]
                self._waiting.clear()
            for request in stranded:
                request._put("error", exc)
            raise
        finally:  # however the worker ends, no cartridge tail stays taken
            for row in self._rows:
                self._solo_end(row, slot=None)

    def _serve(self) -> None:
        prefills_in_a_row = 0  # prefill passes since the last decoding step (at most MAX_PREFILLS_IN_A_ROW)
        idle = True  # the worker starts with the first question, nothing in flight
        with torch.inference_mode():
            while True:
                with self._cond:
                    idle = idle or (not self._waiting and not self._rows)
                    while not self._closed and not self._waiting and not self._rows:
                        self._cond.wait()
                    if idle and not self._rows:  # woken from idle (or just started): let the rest of a burst arrive
                        self._gather()
                    idle = False
                    if self._closed:
                        for row in self._rows:
                            self._solo_end(row, slot=None)
                        for request in [*self._waiting, *(row.request for row in self._rows)]:
                            request._put("error", RuntimeError("the batcher was closed"))
                        self._waiting.clear()
                        self._rows.clear()
                        self._in_flight = 0
                        return
                    admitted = []
                    while self._waiting and len(self._rows) + len(admitted) < self.max_batch:
                        request = self._waiting.popleft()
                        if not request.cancelled:
                            admitted.append(request)
                    self._in_flight += len(admitted)
                new_rows = [_Row(request) for request in admitted]
                try:
                    self._drop_finished()
                    if new_rows:
                        self._prefill(new_rows)
                        self._drop_finished()
                        prefills_in_a_row += 1
                        if prefills_in_a_row < MAX_PREFILLS_IN_A_ROW and self._can_admit():
                            continue  # prefill first: questions that came during the pass get a first token before the next step
                    prefills_in_a_row = 0
                    if self._rows and any(row.pending is not None for row in self._rows):
                        self._decode()
                        self._drop_finished()
                except Exception as exc:  # noqa: BLE001 - delivered to every caller of the failed pass
                    failed = {id(row): row for row in [*self._rows, *new_rows]}
                    for row in failed.values():
                        self._solo_end(row, slot=None)
                        row.request._put("error", exc)
                    self._rows.clear()
                    prefills_in_a_row = 0
                    with self._cond:
                        self._in_flight = 0

    def _ensure_buffers(self, state: KvState, room: int) -> None:
        """Allocate (or grow, keeping the rows' contents) the per-row scratch buffers to ``room`` positions."""
        if room <= self.room:
            return
        room = max(room, INITIAL_ROOM, 2 * self.room)
        new_k, new_v = [], []
        for layer in range(state.num_layers):
            _, kv_heads, _, dim = state.keys[layer].shape
            kb = torch.zeros((self.max_batch, kv_heads, room, dim), dtype=state.keys[layer].dtype, device=self.device)
            vb = torch.zeros((self.max_batch, kv_heads, room, state.values[layer].shape[-1]), dtype=state.values[layer].dtype, device=self.device)
            if self.room:
                kb[:, :, : self.room].copy_(self.kbuf[layer])
                vb[:, :, : self.room].copy_(self.vbuf[layer])
            new_k.append(kb)
            new_v.append(vb)
        self.kbuf, self.vbuf, self.room = new_k, new_v, room

    def _logits_pass(self, start: int, rows: list[_Row], input_ids: torch.Tensor, last: torch.Tensor) -> list[int]:
        """One forward pass for rows in slots ``start:start+len(rows)``: greedy token at each row's ``last`` index."""
        return self._forward_logits(start, rows, input_ids, last).argmax(dim=-1).tolist()

    def _forward_logits(self, start: int, rows: list[_Row], input_ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The pass itself: float32 logits ``[b, vocab]`` at each row's ``last`` input index."""
        step = CascadeStep(self, start, rows, input_ids.shape[1])
        offsets = torch.tensor([row.request.state.num_tokens for row in rows], device=self.device).unsqueeze(1)
        position_ids = offsets + step.write_pos  # [b, n]: the cartridge's length + the row's own position
        hidden = self.base(input_ids=input_ids, position_ids=position_ids, use_cache=False, mnesio_cascade=step).last_hidden_state
        hidden = hidden[torch.arange(len(rows), device=self.device), last]  # [b, hidden]
        self.steps += 1
        return self.lm_head(hidden).float()

    def _prefill(self, new_rows: list[_Row]) -> None:
        """Run the newly admitted questions' prompts (one padded pass), take their first tokens, join the batch."""
        self._ensure_buffers(new_rows[0].request.state, max(len(r.request.prompt) + r.request.max_new_tokens for r in new_rows))
        start = len(self._rows)
        self._rows.extend(new_rows)
        self.max_rows_seen = max(self.max_rows_seen, len(self._rows))
        if start == 0 and len(new_rows) == 1 and self._solo_begin(new_rows[0]):
            row = new_rows[0]
            self._emit_solo(row, torch.tensor([row.request.prompt], device=self.device), logits_to_keep=1)
            return
        longest = max(len(row.request.prompt) for row in new_rows)
        padded = [row.request.prompt + [row.request.prompt[-1]] * (longest - len(row.request.prompt)) for row in new_rows]
        input_ids = torch.tensor(padded, device=self.device)  # [k, longest]; padding is masked out, then overwritten
        last = torch.tensor([len(row.request.prompt) - 1 for row in new_rows], device=self.device)
        tokens = self._logits_pass(start, new_rows, input_ids, last)
        for row, token in zip(new_rows, tokens, strict=True):
            row.length = len(row.request.prompt)
            self._emit(row, token)

    def _decode(self) -> None:
        """One decoding step for every row in flight: feed each row's pending token, take its next one."""
        rows = self._rows
        if len(rows) == 1 and rows[0].solo is not None and not rows[0].request.state.wanted():
            self._emit_solo(rows[0], torch.tensor([[rows[0].pending]], device=self.device))
            return
        for slot, row in enumerate(rows):
            if row.solo is not None:  # no longer alone, or a one-at-a-time call waits for the tail: into its slot
                self._solo_end(row, slot=slot)
        input_ids = torch.tensor([[row.pending] for row in rows], device=self.device)  # [b, 1]
        tokens = self._logits_pass(0, rows, input_ids, torch.zeros(len(rows), dtype=torch.long, device=self.device))
        for row, token in zip(rows, tokens, strict=True):
            row.length += 1
            self._emit(row, token)

    # -- a lone question: the one-at-a-time path's passes ------------------------------------------------------
    def _solo_begin(self, row: _Row) -> bool:
        """Take the row's cartridge tail for it if nobody holds it (KvState.lock, not waited for)."""
        state = row.request.state
        if state.num_tokens + len(row.request.prompt) + row.request.max_new_tokens > state.capacity:
            return False  # the tail has no room for it: growing it would copy the whole cartridge on the worker
        if state.wanted() or not state.lock.acquire(blocking=False):
            return False  # the one-at-a-time path is using it or waits for it (a fidelity check, a long question)
        row.solo = CartridgeCache(state)
        return True

    def _emit_solo(self, row: _Row, input_ids: torch.Tensor, **kwargs) -> None:
        """One pass of the lone row over its cartridge tail, exactly as TransformersKvBackend._greedy_tokens runs it."""
        logits = self.model(input_ids=input_ids, cache=row.solo, use_cache=True, **kwargs).logits[0, -1].float()
        self.steps += 1
        row.length += input_ids.shape[1]
        self._emit(row, int(logits.argmax()))

    def _solo_end(self, row: _Row, *, slot: int | None) -> None:
        """Give the cartridge tail back; with ``slot``, first copy the row's scratch into its slot buffers."""
        cache, row.solo = row.solo, None
        if cache is None:
            return
        state = row.request.state
        try:
            if slot is not None:
                begin = cache.base_length
                for layer, kb, vb in zip(cache.layers, self.kbuf, self.vbuf, strict=True):
                    assert layer.length == begin + row.length, "a lone row's scratch is its cache's tail"
                    kb[slot, :, : row.length].copy_(layer.kbuf[0, :, begin : layer.length])
                    vb[slot, :, : row.length].copy_(layer.vbuf[0, :, begin : layer.length])
        finally:
            cache.crop_back()
            state.lock.release()

    def _emit(self, row: _Row, token: int) -> None:
        """The greedy loop's bookkeeping, as TransformersKvBackend._greedy_tokens does it for one question."""
        request = row.request
        row.pending = None
        if request.stop_at_eos and token in self.eos_ids:
            row.done = True
            return
        request._put("token", token)
        row.num_out += 1
        if row.num_out >= request.max_new_tokens:
            row.done = True
        else:
            row.pending = token

    def _drop_finished(self) -> None:
        """Remove finished and cancelled rows, moving the last rows' scratch into the freed slots."""
        slot = 0
        while slot < len(self._rows):
            row = self._rows[slot]
            if not (row.done or row.request.cancelled):
                slot += 1
                continue
            self._solo_end(row, slot=None)
            if row.done and not row.request.cancelled:
                row.request._put("end", None)
                elapsed = time.perf_counter() - row.request.submitted
                self._seconds_per_question = 0.8 * self._seconds_per_question + 0.2 * elapsed
            last = len(self._rows) - 1
            if slot != last:
                moved = self._rows[last]
                if moved.solo is None:  # (only slot 0 is ever solo) a solo row's scratch is in its cartridge's tail
                    for kb, vb in zip(self.kbuf, self.vbuf, strict=True):
                        kb[slot, :, : moved.length].copy_(kb[last, :, : moved.length])
                        vb[slot, :, : moved.length].copy_(vb[last, :, : moved.length])
                self._rows[slot] = moved
            self._rows.pop()
            with self._cond:
                self._in_flight -= 1
