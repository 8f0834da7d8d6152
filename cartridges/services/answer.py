"""Answering a question for a scope from its active cartridge (or, explicitly, by re-reading the text).

Answering is synchronous in the calling process by default (the model loaded once, an LRU of cartridges).
For a fleet where only GPU workers hold the model, a question is filed as a sealed AnswerRequest, answered by
``cartridge_answer_task`` on the gpu queue and collected once (docs/design/asking.md); task arguments never
hold the question, and an AnswerRecord keeps the version, mode and timings, never the question or answer.
What a cartridge answer reads, fresh or not, is services/serving.py's.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from core.errors import MnesioError
from kvengine import ANSWER_MODES
from kvengine.conversation import Prompt
from memories.selectors import log_head, scope_memories_open

from .. import engine, prometheus
from ..models import AnswerRecord, Layout
from ..selectors import active_configuration
from .ask import DEFAULT_OPTIONS, AskOptions, prompt_validate
from .errors import NothingToCompile, context_too_long_as_422
from .routed_answer import routed_answer, scope_layout
from .serving import Serving, cartridge_serving

log = logging.getLogger("cartridges")

MODES = list(ANSWER_MODES)  # the engine defines them once (kvengine.config)


@dataclass(frozen=True)
class AnswerResult:
    """An answer, the version it came from (None in text mode), and how long it took."""

    answer: str
    version_id: int | None
    mode: str  # "cartridge" | "text"
    ttft_s: float
    total_s: float
    num_context_tokens: int
    num_prompt_tokens: int
    note: str = ""  # says so when the answer re-read the memories as text instead of a cartridge
    num_answer_tokens: int = 0  # tokens generated (the OpenAI-compatible usage.completion_tokens); 0 in old sealed rows
    finish_reason: str = "stop"  # "length" when the answer reached its token budget
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # [{token, logprob, top: [[token, logprob]]}] when asked
    layout: str = "prefix"  # the scope layout that answered in mode "cartridge": prefix | routed
    memory_seqs: list[int] | None = None  # routed: the memories read, in log order (None: the whole scope)
    num_memories_after_version: int = 0  # memories appended after the version, read on top of its blocks
    num_memories_unread: int = 0  # memories appended after the version that this answer did not read (over the bound)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def question_validate(question: object) -> Prompt:
    """Return the question stripped (or the conversation checked), or raise naming the field."""
    return prompt_validate(question)


def mode_validate(mode: object) -> str:
    """Return ``mode`` if it is one of MODES, or raise naming `mode`."""
    if mode not in MODES:
        raise MnesioError(f"`mode` has to be one of {MODES} but got {mode!r}", extra={"field": "mode"})
    return str(mode)


def cartridge_answer(*, scope, question: Prompt, mode: str = "cartridge", actor=None,
                     options: AskOptions = DEFAULT_OPTIONS) -> AnswerResult:
    """Answer ``question`` for ``scope`` from its active cartridge, or by re-reading the text when mode="text".

    With this process's own engine. The API's front door (cartridges/asking.py) adds the per-process bound
    (429) and, with MNESIO_WEB_LOADS_MODEL=false, sends the question to a gpu worker instead.
    """
    question = question_validate(question)
    mode = mode_validate(mode)
    config = active_configuration()
    max_new = options.length()
    if mode == "cartridge" and scope_layout(scope=scope, config=config) == Layout.ROUTED:
        if options.engine_kwargs():  # the routed engine decodes greedily only
            raise MnesioError(
                "the routed layout answers greedily only: leave `decoding` (temperature, top_p, seed, stop, logprobs, "
                "response_format) at its default", extra={"field": "decoding"},
            )
        return _routed_answer(scope=scope, config=config, question=question, max_new=max_new, actor=actor)
    if mode == "cartridge":
        serving = cartridge_serving(scope=scope, config=config)
        with context_too_long_as_422():
            answer = serving.backend.answer(serving.cartridge, question, max_new_tokens=max_new, **options.engine_kwargs())
        return answer_record(scope=scope, version=serving.version, mode=mode, answer=answer, actor=actor, serving=serving)
    texts = [m.text for m in scope_memories_open(scope=scope, as_of=log_head()) if not m.erased]
    if not texts:
        raise NothingToCompile(f"`scope` '{scope.name}' has no memories to re-read", extra={"field": "scope"})
    with context_too_long_as_422():
        answer = engine.backend_for(config).answer_from_text(texts, question, max_new_tokens=max_new,
                                                             **options.engine_kwargs())
    note = "answered by re-reading the memories as text (mode='text'), not from a cartridge"
    return answer_record(scope=scope, version=None, mode=mode, answer=answer, actor=actor, note=note)


def cartridge_answer_choices(*, scope, question: Prompt, num_choices: int, actor=None,
                             options: AskOptions = DEFAULT_OPTIONS) -> list[AnswerResult]:
    """``num_choices`` answers of ``question`` from the scope's cartridge (mode "cartridge"), each recorded: sampled,
    each its own draw (choice i with seed + i), decoded together over the cartridge and the question computed once
    (kvengine/choices.py); greedy, one answer that is every choice (recorded once)."""
    question = question_validate(question)
    config = active_configuration()
    greedy = options.decoding.temperature <= 0
    if greedy or num_choices == 1 or scope_layout(scope=scope, config=config) == Layout.ROUTED:
        if greedy:  # argmax is deterministic: one decode is every choice
            return [cartridge_answer(scope=scope, question=question, actor=actor, options=options)] * num_choices
        # one choice, or a routed scope (which refuses sampling, saying so)
        each = [replace(options, decoding=options.decoding.for_choice(i)) for i in range(num_choices)]
        return [cartridge_answer(scope=scope, question=question, actor=actor, options=choice) for choice in each]
    serving = cartridge_serving(scope=scope, config=config)
    with context_too_long_as_422():
        answers = serving.backend.answer_choices(serving.cartridge, question, num_choices=num_choices,
                                                 max_new_tokens=options.length(), **options.engine_kwargs())
    return [answer_record(scope=scope, version=serving.version, mode="cartridge", answer=answer, actor=actor, serving=serving)
            for answer in answers]


def _routed_answer(*, scope, config, question: Prompt, max_new: int, actor=None) -> AnswerResult:
    """Answer from the scope's routed layout (services/routed_answer.py); recorded as mode "routed"."""
    with context_too_long_as_422():
        answer, seqs = routed_answer(scope=scope, config=config, question=question, max_new_tokens=max_new)
    result = answer_record(scope=scope, version=None, mode="routed", answer=answer, actor=actor)
    return replace(result, mode="cartridge", layout=Layout.ROUTED.value, memory_seqs=seqs)


def answer_record(*, scope, version, mode: str, answer, actor=None, note: str = "",
                  serving: Serving | None = None) -> AnswerResult:
    """Record an engine Answer (AnswerRecord: version, mode, timings, never text) and return its AnswerResult
    (with ``serving``'s counts and note when it answered from a cartridge)."""
    AnswerRecord.objects.create(
        scope=scope,
        version=version,
        mode=mode,
        ttft_s=answer.ttft_s,
        total_s=answer.total_s,
        num_context_tokens=answer.num_context_tokens,
        num_prompt_tokens=answer.num_prompt_tokens,
        actor=actor if getattr(actor, "is_authenticated", False) else None,
    )
    prometheus.answer_observe(mode=mode, ttft_s=answer.ttft_s, total_s=answer.total_s)  # counted once recorded
    log.info("answered scope=%s mode=%s version=%s ttft_s=%.4f", scope.pk, mode, getattr(version, "pk", None), answer.ttft_s)
    return AnswerResult(
        answer=answer.text,
        version_id=version.pk if version else None,
        mode=mode,
        ttft_s=answer.ttft_s,
        total_s=answer.total_s,
        num_context_tokens=answer.num_context_tokens,
        num_prompt_tokens=answer.num_prompt_tokens,
        note=serving.note if serving is not None else note,
        num_answer_tokens=len(answer.token_ids),
        finish_reason=answer.finish_reason,
        logprobs=[{"token": e.token, "logprob": e.logprob, "top": [list(t) for t in e.top]} for e in answer.logprobs],
        num_memories_after_version=serving.num_memories_after_version if serving is not None else 0,
        num_memories_unread=serving.num_memories_unread if serving is not None else 0,
    )
