"""The KvBackend contract: compile memories into a cartridge, answer from it, and the text baseline.

Everything here is plain Python values; backends hold the model. The Django apps import this module,
never the other way round.
"""
from __future__ import annotations

import abc
from collections.abc import Container, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .config import DTYPES, QUANTS
from .conversation import Prompt
from .decoding import Decoding, TokenLogprob
from .header import COMPAT_KEY_FIELDS, BackendDescription, CartridgeHeader, canonical_json

if TYPE_CHECKING:
    from .blocks import BlockLookup, CartridgeParts
    from .format import BlockRef

__all__ = [  # DTYPES and QUANTS live in config.py, the header types in header.py; they are re-exported here
    "COMPAT_KEY_FIELDS", "DTYPES", "QUANTS", "Answer", "BackendDescription", "Cartridge", "CartridgeHeader",
    "ExtensionCheck", "FidelityReport", "KvBackend", "canonical_json",
]


@dataclass
class Cartridge:
    """A compiled cartridge in memory: its header plus the backend's payload (opaque to callers).

    ``stats`` says how compile() got there (never stored): ``blocks_reused`` and ``blocks_computed`` (full
    blocks taken from the ``blocks`` lookup or prefilled), ``tail_tokens``, ``compute_s``, and
    ``memory_positions``: per text given, the first position it can influence (erasure keeps the blocks before).
    """

    header: CartridgeHeader
    payload: Any  # backend-specific (e.g. a tuple of per-layer (k, v) tensors)
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """A generated answer and how long it took."""

    text: str
    token_ids: tuple[int, ...]
    mode: str  # one of ANSWER_MODES, or "none" for TransformersKvBackend.answer_without_memory (the floor)
    num_context_tokens: int  # memory tokens the answer was conditioned on
    num_prompt_tokens: int  # tokens actually run through the model for this answer before decoding
    ttft_s: float  # time to first token, seconds
    total_s: float  # end to end, seconds
    finish_reason: str = "stop"  # "length" when it reached max_new_tokens, else "stop" (end of turn or a stop string)
    logprobs: tuple[TokenLogprob, ...] = ()  # per answer token, when Decoding.logprobs asked for them

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["token_ids"] = list(self.token_ids)
        return d


@dataclass(frozen=True)
class FidelityReport:
    """Next-token agreement between answering from a cartridge and re-reading the text."""

    num_probes: int
    top1_agreement: float  # fraction of probes whose first greedy token is the same
    mean_kl: float  # mean KL(text || cartridge) of the first-token distributions
    max_kl: float
    answers_identical: float  # fraction of probes whose whole greedy answers are identical

    @classmethod
    def of_probes(cls, kls: Sequence[float], *, num_top1: int, num_identical: int) -> FidelityReport:
        """Summarize per-probe results: each probe's KL, how many agreed on the first token, how many whole answers."""
        num_probes = len(kls)
        return cls(
            num_probes=num_probes, top1_agreement=num_top1 / num_probes, mean_kl=sum(kls) / num_probes, max_kl=max(kls),
            answers_identical=num_identical / num_probes,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExtensionCheck:
    """What KvBackend.verify_extension() measured on a cartridge whose first blocks were verified before.

    The new part (from the first unverified block to the end) was re-read in one pass on top of the verified
    blocks; ``fidelity`` compares the probes' first tokens (and whole answers) from the cartridge with that
    re-reading, and ``answers`` holds, per question, the answer from the cartridge and from the re-reading.
    """

    num_verified_blocks: int  # leading full blocks taken as verified (their KV is the re-reading's prefix)
    num_verified_tokens: int
    num_new_tokens: int  # tokens re-read in the one pass (the new part)
    chain_matches: bool  # the header's block ids are the chain of the texts' token ids, and the token count agrees
    max_abs_diff: float  # max |KV(cartridge) - KV(re-read)| over the new positions, every layer, keys and values
    fidelity: FidelityReport
    answers: tuple[tuple[Answer, Answer], ...] = ()  # per question: (from the cartridge, from the re-reading)
    reread_s: float = 0.0  # the one pass over the new part
    probe_s: float = 0.0  # probes and questions, both ways
    # the new part's KV equals its re-reading bit for bit: the probes were not decoded (their answers are the same
    # by construction) and ``fidelity`` says so (agreement 1, KL 0); questions were answered once, from the cartridge
    by_construction: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The figures (numbers only: no answer text)."""
        return {
            "num_verified_blocks": self.num_verified_blocks, "num_verified_tokens": self.num_verified_tokens,
            "num_new_tokens": self.num_new_tokens, "chain_matches": self.chain_matches, "max_abs_diff": self.max_abs_diff,
            "reread_s": round(self.reread_s, 4), "probe_s": round(self.probe_s, 4), "by_construction": self.by_construction,
        }


class KvBackend(abc.ABC):
    """A model that can compile memories into KV state and answer questions from it.

    This is the whole contract the Django apps and kveval rely on: every method they call is declared here
    with its full signature, so callers never probe a backend for what it accepts. Implementations may add
    keyword-only options with defaults (tests/kvengine/test_backend_contract.py checks both backends).
    Thread safety is documented by each implementation.
    """

    max_context_tokens: int  # the model's context window in tokens (compile and answer refuse longer prompts)

    @abc.abstractmethod
    def describe(self) -> BackendDescription:
        """Say what this backend is (model, fingerprints, rope, dtype, quant, device)."""

    @abc.abstractmethod
    def count_tokens(self, texts: Sequence[str]) -> int:
        """Count the memory tokens ``texts`` would take in a cartridge (prompt scaffolding included)."""

    @abc.abstractmethod
    def compile(
        self, texts: Sequence[str], *, log_head: int = 0, labels: dict[str, str] | None = None, blocks: BlockLookup | None = None,
        block_secret: bytes = b"",
    ) -> Cartridge:
        """Compile ``texts`` (in order) into a cartridge; deterministic for equal inputs.

        ``blocks`` looks up stored block parts by id (blocks.py): the longest run from block 0 found there is
        reused, the rest computed; the result is byte-identical to a compile without it. ``block_secret`` keys
        the block ids (blocks.block_id): equal inputs under the same secret give the same bytes.
        Raises EmptyInputError for no texts and ContextTooLongError past the context window.
        """

    @abc.abstractmethod
    def answer(self, cartridge: Cartridge, question: Prompt, *, max_new_tokens: int = 32, decoding: Decoding | None = None) -> Answer:
        """Answer ``question`` (a string, or a conversation.Conversation) from ``cartridge``, greedily unless
        ``decoding`` says otherwise (decoding.py); reads no memory text."""

    def answer_stream(self, cartridge: Cartridge, question: Prompt, *, max_new_tokens: int = 32,
                      decoding: Decoding | None = None) -> Iterator[str | Answer]:
        """Answer like answer(), yielding the text as it is decoded: ``str`` deltas, then the final Answer.

        ``"".join(deltas).strip() == answer.text``: the deltas are the decoded text as it grows (whitespace as
        decoded; the final text is stripped). This default yields the whole answer as one delta; backends that
        decode token by token override it to yield a delta per token.
        """
        answer = self.answer(cartridge, question, max_new_tokens=max_new_tokens, decoding=decoding)
        if answer.text:
            yield answer.text
        yield answer

    @abc.abstractmethod
    def answer_choices(self, cartridge: Cartridge, question: Prompt, *, num_choices: int, max_new_tokens: int = 32,
                       decoding: Decoding | None = None) -> list[Answer]:
        """``num_choices`` answers of ``question`` from ``cartridge``: choice i is what answer() gives under
        ``decoding.for_choice(i)`` (its seed + i when a seed was given); a greedy decoding is one answer, every choice."""

    @abc.abstractmethod
    def answer_from_text(self, texts: Sequence[str], question: Prompt, *, max_new_tokens: int = 32,
                         decoding: Decoding | None = None) -> Answer:
        """Answer by re-reading ``texts`` for this one question (the baseline)."""

    @abc.abstractmethod
    def fidelity(
        self, cartridge: Cartridge, texts: Sequence[str], probes: Sequence[str], *, max_new_tokens: int | None = None
    ) -> FidelityReport:
        """Compare answering ``probes`` from ``cartridge`` with re-reading ``texts``.

        ``max_new_tokens`` bounds the greedy answers compared for ``answers_identical`` (None: the backend's
        default); top-1 agreement and KL are on the first token whatever it is.
        """

    @abc.abstractmethod
    def verify_extension(
        self,
        cartridge: Cartridge,
        texts: Sequence[str],
        probes: Sequence[str],
        *,
        num_verified_blocks: int,
        max_new_tokens: int | None = None,
        questions: Sequence[str] = (),
        answer_max_new_tokens: int = 32,
        block_secret: bytes = b"",
    ) -> ExtensionCheck:
        """Check the part of ``cartridge`` after its first ``num_verified_blocks`` blocks against ``texts``.

        The caller vouches for those blocks (their ids and digests passed an earlier check); this checks that
        the header's block ids are the chain of ``texts`` (under ``block_secret``, the one it was compiled with),
        re-reads the new tokens ONCE on top of the verified blocks' KV by a code path of its own (in the chunks compile() reads them in: where a prefill is cut changes the
        float sums, so a right cartridge equals its re-reading bit for bit), compares the new positions' KV, and answers
        ``probes`` (``max_new_tokens`` each; None: the backend's fidelity default) and ``questions``
        (``answer_max_new_tokens`` each) from the cartridge and from that re-reading, computed once for all.
        """

    @abc.abstractmethod
    def dumps(self, cartridge: Cartridge) -> bytes:
        """Serialize to the safetensors cartridge format (deterministic bytes)."""

    @abc.abstractmethod
    def loads(self, data: bytes) -> Cartridge:
        """Deserialize and verify (sha256, compatibility with describe()); raise on any mismatch."""

    @abc.abstractmethod
    def dump_parts(self, cartridge: Cartridge, *, stored: Container[BlockRef] = ()) -> CartridgeParts:
        """Serialize by parts (blocks.py): a part per full block and the tail part; deterministic bytes.

        A block whose ref (id and part digest) is in ``stored`` is left out (its bytes None): the caller stores it
        already (an incremental compile reuses most blocks, and serializing them again is most of its copying)."""

    @abc.abstractmethod
    def load_parts(self, tail: bytes | memoryview, blocks: BlockLookup) -> Cartridge:
        """Load a cartridge stored by parts: the tail part, each block part found by id in ``blocks``; all verified."""

    def variant(self, *, dtype: str | None = None, quant: str | None = None) -> KvBackend | None:
        """A backend for the same model in another ``dtype`` and/or ``quant`` (None: keep this one's).

        Switching quant (or f32 to a lower dtype) then reuses the loaded weights instead of loading the model
        again. None, the default, means this backend cannot share its weights: load a new one instead.
        """
        return None
