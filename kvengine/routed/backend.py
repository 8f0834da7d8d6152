"""The routed methods of TransformersKvBackend: thin calls into this package, kept apart from the prefix paths."""
from __future__ import annotations

from collections.abc import Sequence

from ..base import Answer
from ..divergence import AnswerDivergence
from .answering import NO_REPAIR, RoutedAnswer, answer_reread, answer_routed, routed_divergence
from .chunk_bytes import chunk_dumps, chunk_loads
from .chunks import MemoryChunk, compile_chunk
from .repair import RepairPolicy


class RoutedMixin:
    """compile_chunk / chunk_dumps / chunk_loads / answer_routed / answer_reread / routed_divergence on a transformers backend."""

    def compile_chunk(self, text: str) -> MemoryChunk:
        """One memory's chunk: its KV computed once after the shared prefix (routed.chunks)."""
        return compile_chunk(self, text)

    def chunk_dumps(self, chunk: MemoryChunk, *, quant: str = "q8") -> bytes:
        """A chunk's bytes (routed.chunk_bytes; ``quant`` "none" keeps this backend's dtype)."""
        return chunk_dumps(chunk, quant=quant)

    def chunk_loads(self, data: bytes) -> MemoryChunk:
        """A chunk back from chunk_dumps' bytes, in this backend's dtype and on its device."""
        return chunk_loads(data, dtype=self.torch_dtype, device=str(self.device))

    def answer_routed(
        self, chunks: Sequence[MemoryChunk], question: str, *, repair: RepairPolicy = NO_REPAIR,
        max_new_tokens: int = 32, stop_at_eos: bool = True,
    ) -> RoutedAnswer:
        """Assemble ``chunks`` in the order given after the shared prefix, ``repair``, then answer (routed.answering)."""
        return answer_routed(self, chunks, question, repair=repair, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)

    def answer_reread(self, chunks: Sequence[MemoryChunk], question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """The routed answer's reference: re-read the chunks' exact token ids and the question in one prefill."""
        return answer_reread(self, chunks, question, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)

    def routed_divergence(
        self, chunks: Sequence[MemoryChunk], question: str, *, repair: RepairPolicy = NO_REPAIR,
        max_new_tokens: int = 32, reference: Answer | None = None,
    ) -> AnswerDivergence:
        """Per-position KL and top-1 agreement of the routed answer against the re-reading's, teacher-forced."""
        return routed_divergence(self, chunks, question, repair=repair, max_new_tokens=max_new_tokens, reference=reference)
