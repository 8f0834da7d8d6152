"""Answering a question for a scope from its active cartridge (or, explicitly, by re-reading the text).

Answering is synchronous in the calling process by default (the model loaded once, an LRU of cartridges).
For a fleet where only GPU workers hold the model, a question is filed as a sealed AnswerRequest, answered by
``cartridge_answer_task`` on the gpu queue and collected once (docs/design/asking.md); task arguments never
hold the question, and an AnswerRecord keeps the version, mode and timings, never the question or answer.

Fresh answers: an ask never misses a committed memory. When the scope's head is past the serving version's,
``cartridge_serving`` compiles the scope at its head in memory (never stored) on the scope's stored blocks,
the answer the refreshed version will give. Past MNESIO_FRESH_MAX_MEMORIES memories after the version (or
the model's window) the version answers alone and says how many it did not read. A scope with no version yet
(new, or after a configuration switch) is compiled the same way from nothing when it holds at most
MNESIO_FRESH_MAX_MEMORIES memories; past that, or with none, the ask is NoActiveCartridge (409).
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from django.db import transaction

from core.errors import Conflict, MnesioError
from kvengine import ANSWER_MODES
from kvengine.base import Cartridge, KvBackend
from kvengine.conversation import Prompt
from kvengine.text import normalize_answer
from memories import crypto
from memories.models import Memory, Scope, Subject
from memories.selectors import (
    legacy_subjects_in_scope,
    log_head,
    memory_keys_forgotten_lock,
    scope_head,
    scope_memories_open,
    subject_id_variants,
)
from memories.services import subject_id_validate

from .. import conf, engine, prometheus
from ..models import AnswerRecord, CartridgeVersion, EvaluationCase, Layout
from ..selectors import active_configuration, active_version, evaluation_case_aad
from ..storage import block_lookup, scope_blocks_live
from .ask import DEFAULT_OPTIONS, AskOptions, prompt_validate
from .blocksecret import scope_block_secret
from .compile import compile_cartridge, compile_input
from .errors import ContextTooLong, NoActiveCartridge, NothingToCompile, context_too_long_as_422
from .routed_answer import routed_answer, scope_layout

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


@dataclass(frozen=True)
class Serving:
    """What an ask in mode "cartridge" reads: the serving version's cartridge, or that version's blocks with the
    memories appended after it compiled on top, in memory (module docstring, "Fresh answers"); without a version
    (None), the scope's memories compiled in memory."""

    version: CartridgeVersion | None
    cartridge: Cartridge
    backend: KvBackend
    num_memories_after_version: int = 0  # surviving memories after version.log_head compiled on top of it
    num_memories_unread: int = 0  # memories after version.log_head left out (over the bound, or past the window)
    unread_reason: str = ""

    @property
    def note(self) -> str:
        if self.version is None:
            return (f"read the scope's {self.num_memories_after_version} memories in memory: it has no active version "
                    "yet (its refresh compiles one)")
        if self.num_memories_unread:
            return (f"answered from version {self.version.pk} without the {self.num_memories_unread} memories appended "
                    f"after it ({self.unread_reason}); the refresh catches up")
        if self.num_memories_after_version:
            return (f"read the {self.num_memories_after_version} memories appended after version {self.version.pk} "
                    "on top of its blocks")
        return ""


def cartridge_serving(*, scope, config) -> Serving:
    """The cartridge that answers for ``scope``: the active version's, extended in memory (never stored) with the
    memories appended after it, up to MNESIO_FRESH_MAX_MEMORIES of them; without a version, the scope's memories
    compiled in memory (_serving_from_nothing)."""
    version = active_version(scope=scope, configuration=config)
    if version is None:
        return _serving_from_nothing(scope=scope, config=config)
    head = scope_head(scope=scope)
    if head <= version.log_head:
        cartridge, backend = engine.cartridge_load(version=version, config=config)
        return Serving(version=version, cartridge=cartridge, backend=backend)
    num_after = Memory.objects.filter(scope=scope, seq__gt=version.log_head, seq__lte=head).count()
    limit = conf.fresh_max_memories()
    backend = engine.backend_for(config)
    reason = ""
    if num_after > limit:
        reason = f"more than MNESIO_FRESH_MAX_MEMORIES={limit}"
    elif version.block_size and getattr(backend, "block_size", version.block_size) != version.block_size:
        reason = "the version was cut into blocks of another size: its blocks cannot be reused"
    if reason:
        return _serving_stale(version=version, config=config, num_unread=num_after, reason=reason)
    if not _fresh_slot_take():  # before opening the scope: a refused ask must not decrypt it for nothing
        return _serving_stale(version=version, config=config, num_unread=num_after,
                              reason=f"MNESIO_FRESH_MAX_CONCURRENT={conf.fresh_max_concurrent()} fresh compiles are running")
    try:
        data = compile_input(scope=scope, head=head)  # leaves out every memory whose key is shredded, as a compile does
        num_fresh = sum(1 for seq in data.seqs if seq > version.log_head)
        if not num_fresh:  # every memory after the version was erased since: the version holds the surviving ones
            cartridge, backend = engine.cartridge_load(version=version, config=config)
            return Serving(version=version, cartridge=cartridge, backend=backend)
        try:
            cartridge = compile_cartridge(backend=backend, data=data, blocks=block_lookup(scope=scope, live=scope_blocks_live(scope=scope)),
                                          block_secret=scope_block_secret(scope=scope))
        except ContextTooLong:
            return _serving_stale(version=version, config=config, num_unread=num_fresh,
                                  reason="the scope at its head is over the model's context window")
    finally:
        _fresh_slot_give()
    log.info("fresh answer scope=%s version=%s num_memories_after_version=%d blocks_reused=%s computed_tokens=%s",
             scope.pk, version.pk, num_fresh, cartridge.stats.get("blocks_reused"), cartridge.stats.get("computed_tokens"))
    return Serving(version=version, cartridge=cartridge, backend=backend, num_memories_after_version=num_fresh)


def _serving_from_nothing(*, scope, config) -> Serving:
    """A scope without an active version under ``config``: all its memories compiled in memory (never stored), what a
    compile at its head computes, when they are at most MNESIO_FRESH_MAX_MEMORIES; else NoActiveCartridge (409) saying
    what to do, and FreshCompilesBusy (429) while the process's fresh-compile slots are all taken."""
    head = scope_head(scope=scope)
    num_memories = Memory.objects.filter(scope=scope, seq__lte=head).count()  # erased ones too: opened only below
    limit = conf.fresh_max_memories()
    if num_memories > limit:
        raise _no_cartridge(scope=scope, config=config, why=f", and its {num_memories} memories are more than "
                            f"MNESIO_FRESH_MAX_MEMORIES={limit} to read in memory", num_memories=num_memories)
    if not num_memories:
        raise _no_cartridge(scope=scope, config=config, why=" and no memories; append memories first (an ask reads "
                            "them at once)", num_memories=0)
    if not _fresh_slot_take():  # before opening the scope: a refused ask must not decrypt it for nothing
        raise FreshCompilesBusy(scope=scope)
    try:
        try:
            data = compile_input(scope=scope, head=head)  # leaves out every memory whose key is shredded, as a compile does
        except NothingToCompile:  # every memory was forgotten
            raise _no_cartridge(scope=scope, config=config, why=" and no memories left (all were forgotten); append "
                                "memories first", num_memories=0) from None
        backend = engine.backend_for(config)
        cartridge = compile_cartridge(backend=backend, data=data, blocks=block_lookup(scope=scope, live=scope_blocks_live(scope=scope)),
                                      block_secret=scope_block_secret(scope=scope))
    finally:
        _fresh_slot_give()
    log.info("fresh answer scope=%s version=None num_memories=%d computed_tokens=%s", scope.pk, len(data.seqs),
             cartridge.stats.get("computed_tokens"))
    return Serving(version=None, cartridge=cartridge, backend=backend, num_memories_after_version=len(data.seqs))


def _no_cartridge(*, scope, config, why: str, num_memories: int) -> NoActiveCartridge:
    return NoActiveCartridge(
        f"`scope` '{scope.name}' has no active cartridge under the configuration {config.key()}{why}; compile and "
        "activate one (a refresh does), or ask with mode='text' to re-read the memories",
        extra={"field": "scope", "num_memories": num_memories},
    )


class FreshCompilesBusy(MnesioError):
    """A scope without a version to fall back on found every fresh-compile slot taken: ask again shortly (429)."""

    status_code = 429

    def __init__(self, *, scope):
        self.retry_after_s = max(1, conf.ask_retry_after_s())
        super().__init__(
            f"`scope` '{scope.name}' has no active cartridge yet and this process's "
            f"MNESIO_FRESH_MAX_CONCURRENT={conf.fresh_max_concurrent()} fresh compiles are running; ask again in "
            f"{self.retry_after_s} s",
            extra={"field": "scope", "kind": "overloaded", "retry_after_s": self.retry_after_s},
        )


_fresh_lock = threading.Lock()
_fresh_running = 0  # fresh compiles in this process now (bounded by MNESIO_FRESH_MAX_CONCURRENT)


def _fresh_slot_take() -> bool:
    """Claim one of the process's fresh-compile slots without waiting; False when all are taken."""
    global _fresh_running
    with _fresh_lock:
        if _fresh_running >= conf.fresh_max_concurrent():
            return False
        _fresh_running += 1
        return True


def _fresh_slot_give() -> None:
    global _fresh_running
    with _fresh_lock:
        _fresh_running -= 1


def _serving_stale(*, version, config, num_unread: int, reason: str) -> Serving:
    cartridge, backend = engine.cartridge_load(version=version, config=config)
    return Serving(version=version, cartridge=cartridge, backend=backend, num_memories_unread=num_unread, unread_reason=reason)


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


MAX_CASE_SUBJECTS = 100


def evaluation_case_subjects_resolve(*, scope, subjects: object) -> list[Subject]:
    """Return the subjects named by external id, each of which has to have memories in ``scope`` and not be erased."""
    if not isinstance(subjects, list) or not all(isinstance(x, str) and x.strip() for x in subjects):
        raise MnesioError("`subjects` has to be a list of subject ids (non-empty strings)", extra={"field": "subjects"})
    if len(subjects) > MAX_CASE_SUBJECTS:
        raise MnesioError(f"`subjects` has to hold at most {MAX_CASE_SUBJECTS} ids but got {len(subjects)}",
                          extra={"field": "subjects"})
    wanted = sorted({subject_id_validate(x) for x in subjects})
    # only subjects of this scope: a subject known elsewhere is as unknown here as one that never existed
    rows = {}
    for external_id in wanted:
        row = (
            Subject.objects.filter(scope=scope, external_id__in=subject_id_variants(external_id), memories__scope=scope).first()
            or legacy_subjects_in_scope(external_id=external_id, scope=scope).first()
        )
        if row is not None:
            rows[external_id] = row
    unknown = [x[:200] for x in wanted if x not in rows]
    if unknown:
        raise MnesioError(
            f"`subjects` has to name subjects with memories in scope '{scope.name}' but got unknown {unknown}",
            extra={"field": "subjects", "unknown": unknown},
        )
    erased = sorted(x for x, row in rows.items() if row.is_shredded)
    if erased:
        raise Conflict(f"`subjects` {erased} were erased; a case about them is refused", extra={"field": "subjects"})
    return list(rows.values())


def _memories_quoted(*, scope, question: str, answers: list[str]) -> list[tuple[int, int | None]]:
    """(seq, subject pk) of the scope's memories a case quotes: an accepted answer in their text, or their whole
    text in the question (normalized as the gate's answers are, kvengine.text.normalize_answer, whole words)."""
    wanted = [f" {n} " for n in (normalize_answer(a) for a in answers) if n]
    asked = f" {normalize_answer(question)} "
    found = []
    for memory in scope_memories_open(scope=scope, as_of=log_head()):
        if memory.erased:
            continue
        said = normalize_answer(memory.text)
        text = f" {said} "
        if any(w in text for w in wanted) or (said and f" {said} " in asked):
            found.append((memory.seq, memory.subject_id))
    return found


def evaluation_case_add(
    *, scope, question: str, answers: list[str], subjects: list[str] | None = None, actor=None
) -> EvaluationCase:
    """Attach a sealed evaluation case to ``scope`` for the gate, linked to the subjects it concerns.

    The subjects are ``subjects`` (external ids with memories in the scope) plus every subject whose memory
    quotes an accepted answer now; the memories are those _memories_quoted finds. Erasing any of those subjects,
    forgetting any of those memories or deleting the scope erases the case (services.forget). The subject rows
    and the memories' own keys are locked while the case is linked, so an erasure either sees the link or is
    seen here (refused).
    """
    question = question_validate(question)
    if not isinstance(answers, list) or not answers:
        raise MnesioError("`answers` has to be a non-empty list of strings", extra={"field": "answers"})
    if not all(isinstance(a, str) and a.strip() for a in answers):
        raise MnesioError("`answers` has to hold only non-empty strings", extra={"field": "answers"})
    answers = [a.strip() for a in answers]
    given = evaluation_case_subjects_resolve(scope=scope, subjects=subjects) if subjects is not None else []
    quoted = _memories_quoted(scope=scope, question=question, answers=answers)
    subject_ids = {s.pk for s in given} | {subject_id for _, subject_id in quoted if subject_id is not None}
    with transaction.atomic():
        # the scope row first: a deletion committed before is seen here; one after waits and then erases this case
        if not Scope.objects.select_for_update().filter(pk=scope.pk, deleted_at__isnull=True).exists():
            raise Conflict(f"scope '{scope.name}' was deleted; a case about it is refused", extra={"field": "scope"})
        linked = list(Subject.objects.select_for_update().filter(pk__in=subject_ids).order_by("pk"))
        erased = sorted(s.external_id for s in linked if s.is_shredded)
        if erased:  # erased between the checks above and this lock
            raise Conflict(f"`subjects` {erased} were erased; a case about them is refused", extra={"field": "subjects"})
        # a memory forgotten since it was read above: its shred committed, so its erasure may have run already
        forgotten = memory_keys_forgotten_lock(seqs=[seq for seq, _ in quoted])
        if forgotten:
            raise Conflict("a memory this case quotes was forgotten; a case about it is refused", extra={"field": "answers"})
        case = EvaluationCase.objects.create(
            scope=scope, created_by=actor if getattr(actor, "is_authenticated", False) else None, memories_recorded=True
        )
        # the associated data names the row, so the key and the content are sealed once the id exists
        key = crypto.new_data_key()
        wrapped, wrapped_by = crypto.wrap(key, aad=evaluation_case_aad(case.pk, "key"))
        content = json.dumps({"question": question, "answers": answers}).encode()
        EvaluationCase.objects.filter(pk=case.pk).update(
            wrapped_key=wrapped, wrapped_by=wrapped_by, sealed=crypto.seal_box(key, content, aad=evaluation_case_aad(case.pk, "content"))
        )
        case.subjects.set(linked)
        case.memories.set(Memory.objects.filter(seq__in=[seq for seq, _ in quoted]))
    case.refresh_from_db()
    log.info("evaluation case added id=%s scope=%s num_subjects=%d", case.pk, scope.pk, len(linked))
    return case
