"""Answering from chunks: routed (assemble, repair, then the question) and its reference, re-reading the same ids.

The reference re-reads exactly the token ids the assembly holds (P, the chunks' ids with the last separator
dropped) and the same tail, in one plain prefill: "retrieval, then re-read". chunks.check_chunk_ids says
whether those ids are also the prompt layout's tokenization of the memories; where they are not, the
reference is still re-reading the same tokens, which is what the routed answer approximates.

``routed_divergence`` is divergence.py's measure along the reference's answer, teacher-forced: per position
KL(reference || routed) and top-1 agreement; "identical" is whether greedy decoding over the routed state
would give the reference's answer (each position's argmax is the next token, and where the reference
stopped early, an end-of-turn token).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..base import Answer
from ..divergence import AnswerDivergence
from ..kvcache import CartridgeCache
from .assembly import Assembly, assemble
from .chunks import MemoryChunk, shared_prefix, tail_token_ids
from .host import RoutedHost
from .repair import RepairPolicy
from .repair import repair as apply_repair
from .rotation import rotary_of

NO_REPAIR = RepairPolicy.none()  # the default: chunks as compiled, keys moved



@dataclass(frozen=True)
class RoutedAnswer(Answer):
    """An Answer from an assembly of chunks, with what its repair did."""

    repair: str = "none"  # RepairPolicy.name
    num_recomputed_tokens: int = 0  # tokens the repair recomputed through all layers
    repair_s: float = 0.0  # seconds spent assembling and repairing (within ttft_s)


def _repaired(backend: RoutedHost, chunks: Sequence[MemoryChunk], tail: list[int], policy: RepairPolicy, room: int) -> tuple[Assembly, int]:
    """The assembly of ``chunks`` with ``policy`` applied (a fresh state: stored chunks are never written)."""
    assembly = assemble(shared_prefix(backend), chunks, rotary_of(backend.model), room=len(tail) + room)
    backend._check_room(len(assembly.token_ids) + len(tail), room, "the chunks plus the question and answer")
    return assembly, apply_repair(backend.model, assembly, policy)


def answer_routed(
    backend: RoutedHost, chunks: Sequence[MemoryChunk], question: str, *, repair: RepairPolicy = NO_REPAIR,
    max_new_tokens: int = 32, stop_at_eos: bool = True,
) -> RoutedAnswer:
    """Assemble ``chunks`` (in the order given) after P, repair, prefill the question and decode greedily."""
    start = time.perf_counter()
    tail = tail_token_ids(backend.layout, question)
    with torch.inference_mode():
        assembly, num_recomputed = _repaired(backend, chunks, tail, repair, max_new_tokens)
        repair_s = time.perf_counter() - start
        out, _, ttft = backend._greedy(tail, CartridgeCache(assembly.state), max_new_tokens, start, stop_at_eos=stop_at_eos)
    num_context = len(assembly.token_ids) - assembly.num_prefix_tokens
    answer = backend._answer(out, "routed", num_context, len(tail) + num_recomputed, ttft, time.perf_counter() - start)
    return RoutedAnswer(**answer.__dict__, repair=repair.name, num_recomputed_tokens=num_recomputed, repair_s=repair_s)


def reread_token_ids(backend: RoutedHost, chunks: Sequence[MemoryChunk], question: str) -> tuple[list[int], int]:
    """The reference's prompt ids (P, the chunks' ids as assembled, the tail) and how many of them are memory tokens."""
    ids = list(shared_prefix(backend).token_ids)
    num_context = 0
    for index, chunk in enumerate(chunks):
        n = chunk.num_tokens - (chunk.num_separator_tokens if index == len(chunks) - 1 else 0)
        ids += chunk.token_ids[:n]
        num_context += n
    return ids + tail_token_ids(backend.layout, question), num_context


def answer_reread(
    backend: RoutedHost, chunks: Sequence[MemoryChunk], question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True,
) -> Answer:
    """The reference: one plain prefill of P + the chunks' ids + the tail, then greedy decoding."""
    start = time.perf_counter()
    ids, num_context = reread_token_ids(backend, chunks, question)
    backend._check_room(len(ids), max_new_tokens, "the chunks plus the question and answer")
    with torch.inference_mode():
        out, _, ttft = backend._greedy(ids, None, max_new_tokens, start, stop_at_eos=stop_at_eos)
    return backend._answer(out, "text", num_context, len(ids), ttft, time.perf_counter() - start)


def _forced(backend: RoutedHost, ids: list[int], answer_ids: list[int], cache: DynamicCache) -> torch.Tensor:
    """Feed ``ids`` + ``answer_ids`` on ``cache``: next-token log-probs [len(answer_ids) + 1, vocab] (float32)."""
    input_ids = torch.tensor([ids + answer_ids], device=backend.device)  # (1, n)
    logits = backend.model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=len(answer_ids) + 1).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def reread_logprobs(backend: RoutedHost, chunks: Sequence[MemoryChunk], question: str, answer_ids: Sequence[int]) -> torch.Tensor:
    """The reference's next-token log-probs [len(answer_ids) + 1, vocab] along ``answer_ids``, teacher-forced (one prefill)."""
    ids, _ = reread_token_ids(backend, chunks, question)
    backend._check_room(len(ids) + len(answer_ids), 1, "the chunks plus the question and answer")
    with torch.inference_mode():
        return _forced(backend, ids, list(answer_ids), DynamicCache(config=backend.model.config))


def routed_logprobs(
    backend: RoutedHost, chunks: Sequence[MemoryChunk], question: str, answer_ids: Sequence[int], *, repair: RepairPolicy = NO_REPAIR,
) -> torch.Tensor:
    """The routed next-token log-probs [len(answer_ids) + 1, vocab] along ``answer_ids``, teacher-forced over the repaired assembly."""
    tail = tail_token_ids(backend.layout, question)
    with torch.inference_mode():
        assembly, _ = _repaired(backend, chunks, tail, repair, len(answer_ids) + 1)
        return _forced(backend, tail, list(answer_ids), CartridgeCache(assembly.state))


def routed_divergence(
    backend: RoutedHost, chunks: Sequence[MemoryChunk], question: str, *, repair: RepairPolicy = NO_REPAIR,
    max_new_tokens: int = 32, reference: Answer | None = None,
) -> AnswerDivergence:
    """KL(reference || routed) and top-1 agreement per position of the reference's answer, teacher-forced.

    ``reference``: answer_reread()'s answer to the same chunks and question (decoded here when None).
    """
    if reference is None:
        reference = answer_reread(backend, chunks, question, max_new_tokens=max_new_tokens)
    answer_ids = list(reference.token_ids)
    logp_ref = reread_logprobs(backend, chunks, question, answer_ids)
    logp_routed = routed_logprobs(backend, chunks, question, answer_ids, repair=repair)
    return divergence_of(backend, logp_ref, logp_routed, answer_ids, max_new_tokens)


def divergence_of(
    backend: RoutedHost, logp_ref: torch.Tensor, logp_routed: torch.Tensor, answer_ids: Sequence[int], max_new_tokens: int
) -> AnswerDivergence:
    """divergence.AnswerDivergence of two teacher-forced log-prob tables along the reference's ``answer_ids``."""
    greedy = logp_routed.argmax(dim=-1).tolist()
    answer_ids = list(answer_ids)
    stopped = len(answer_ids) >= max_new_tokens or greedy[len(answer_ids)] in backend._eos_ids
    return AnswerDivergence.of(logp_ref, logp_routed, identical=greedy[: len(answer_ids)] == answer_ids and stopped)
