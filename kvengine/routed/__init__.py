"""Routed cartridges: memories compiled one chunk each after a shared prefix, assembled per question.

chunks.py compiles a memory's KV after the shared prefix P; rotation.py moves cached keys to other positions;
assembly.py puts P and the chosen chunks together and recomputes token subsets in place; repair.py decides
which tokens; answering.py answers from the result and from its reference, re-reading the same token ids;
chunk_bytes.py stores a chunk. Background and the published work: docs and the routed-KV notes.
"""
from __future__ import annotations

from .answering import (
    NO_REPAIR,
    RoutedAnswer,
    answer_reread,
    answer_routed,
    divergence_of,
    reread_logprobs,
    reread_token_ids,
    routed_divergence,
    routed_logprobs,
)
from .assembly import Assembly, assemble, recompute
from .chunk_bytes import CHUNK_QUANTS, chunk_dumps, chunk_loads
from .chunks import (
    MemoryChunk,
    SharedPrefix,
    check_chunk_ids,
    chunk_token_ids,
    compile_chunk,
    shared_prefix,
    tail_token_ids,
)
from .repair import RepairPolicy
from .rotation import rerotate, rotary_of

__all__ = [
    "NO_REPAIR", "Assembly", "CHUNK_QUANTS", "MemoryChunk", "RepairPolicy", "RoutedAnswer", "SharedPrefix", "answer_reread", "answer_routed",
    "assemble", "check_chunk_ids", "chunk_dumps", "chunk_loads", "chunk_token_ids", "compile_chunk", "recompute", "reread_token_ids",
    "rerotate", "rotary_of", "routed_divergence", "shared_prefix", "tail_token_ids", "divergence_of", "reread_logprobs", "routed_logprobs",
]
