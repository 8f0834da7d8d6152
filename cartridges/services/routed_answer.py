"""Answering from the routed layout: retrieve the question's memories, assemble their chunks, repair, answer.

A scope's layout is a setting (ScopeSettings.layout): ``prefix`` answers from the active prefix cartridge as
always; ``routed`` from chunks; ``auto`` from the prefix cartridge while the scope has one serving, and from
chunks when it has none and its memories pass the model's window (a prefix cartridge can never hold them), so
a scope of any size is answered. The memories read are BM25's best (memories.selectors.memory_search) that fit
the token budget, assembled in log order; missing chunks are compiled on the way (an append computes only its own).
"""
from __future__ import annotations

import logging
from typing import Any

from django.db.models import Sum

from kvengine.conversation import Prompt
from kvengine.retrieval import bm25_tokenize
from memories.models import Scope
from memories.selectors import memory_search, scope_memories_open

from .. import conf, engine
from ..models import Layout, RoutedChunk
from ..selectors import active_version, scope_settings_get
from .errors import NothingToCompile
from .routed_chunks import repair_policy, routed_chunks_compile, routed_chunks_open

log = logging.getLogger("cartridges")


def scope_layout(*, scope: Scope, config: Any) -> str:
    """The layout ``scope`` answers from now: prefix or routed (``auto`` resolved as the module docstring says)."""
    layout = scope_settings_get(scope=scope).layout
    if layout != Layout.AUTO:
        return layout
    if active_version(scope=scope, configuration=config) is not None:
        return Layout.PREFIX
    return Layout.ROUTED if scope_over_window(scope=scope, config=config) else Layout.PREFIX


def scope_over_window(*, scope: Scope, config: Any) -> bool:
    """Whether the scope's live memories pass the model's window (what a prefix cartridge can hold).

    Its stored chunks' tokens first (one query: once the chunks an auto scope's asks compiled pass the window,
    nothing is decrypted); else the memories are opened and counted.
    """
    backend = engine.backend_for(config)
    window = backend.describe().max_context_tokens
    stored = RoutedChunk.objects.filter(scope=scope, config_key=engine.kv_config(config).key).aggregate(n=Sum("num_tokens"))["n"]
    if stored and stored > window:
        return True
    texts = [m.text for m in scope_memories_open(scope=scope) if not m.erased]
    return bool(texts) and backend.count_tokens(texts) > window


def routed_memories_choose(*, scope: Scope, config: Any, question: Prompt) -> list[int]:
    """The seqs to read for ``question``: BM25's top k whose chunks fit the token budget, in log order.

    A conversation is searched by its last user turn (the question being asked).
    """
    question = question if isinstance(question, str) else question.turns[-1].content
    if not bm25_tokenize(question):  # no word to search by: nothing matches (memory_search would name `query`)
        return []
    ranked = memory_search(scope=scope, query=question, k=conf.routed_top_k())
    seqs = [r.seq for r in ranked]
    routed_chunks_compile(scope=scope, config=config, seqs=seqs)  # normally a no-op: appends compile their own
    config_key = engine.kv_config(config).key
    sizes = dict(
        RoutedChunk.objects.filter(scope=scope, config_key=config_key, memory__seq__in=seqs).values_list("memory__seq", "num_tokens")
    )
    budget, chosen = conf.routed_token_budget(), []
    for seq in seqs:  # best first: a lower-ranked memory never displaces a better one
        if seq in sizes and sizes[seq] <= budget:
            chosen.append(seq)
            budget -= sizes[seq]
    return sorted(chosen)


def routed_answer(*, scope: Scope, config: Any, question: Prompt, max_new_tokens: int):
    """The engine's routed answer to ``question`` and the seqs it read (log order)."""
    seqs = routed_memories_choose(scope=scope, config=config, question=question)
    chunks = routed_chunks_open(scope=scope, config=config, seqs=seqs)
    seqs = [seq for seq in seqs if seq in chunks]  # a memory erased meanwhile is not read
    if not seqs:
        raise NothingToCompile(
            f"`question` matches no memory of scope '{scope.name}' (the routed layout reads the memories it matches)",
            extra={"field": "question"},
        )
    backend = engine.backend_for(config)
    answer = backend.answer_routed(
        [chunks[seq] for seq in seqs], question, repair=repair_policy(conf.routed_repair()), max_new_tokens=max_new_tokens,
    )
    log.info("routed answer scope=%s memories=%d repair=%s", scope.pk, len(seqs), conf.routed_repair())
    return answer, seqs
