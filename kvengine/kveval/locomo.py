"""LoCoMo (long multi-session conversations with questions): load it as memories and QA items, and pose its questions.

One memory per turn, in log order, each carrying its session's date and time and its speaker
(``[1:56 pm on 8 May, 2023] <speaker>: ...``), so a temporal question can be answered from the memories alone.
A question's evidence (LoCoMo's ``dia_id``s) is mapped to the indices of those memories. The data set is
CC BY-NC (evaluation only): it is read from where it lies and never copied into the repository.

Odd items are kept or skipped, never fatal, and counted in ``LocomoData.oddities``.
"""
from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
# the option LoCoMo offers beside the adversarial answer (task_eval/gpt_utils.py); choosing it scores 1
NOT_MENTIONED = "Not mentioned in the conversation"
TEMPORAL_SUFFIX = " Use DATE of CONVERSATION to answer with an approximate date."
# The paper's QA instructions (task_eval/gpt_utils.py's QA_PROMPT and QA_PROMPT_CAT_5, on one line): the
# memories come first in every mode, so "the above context" is where they are.
QA_TEMPLATE = ("Based on the above context, write an answer in the form of a short phrase for the following "
               "question. Answer with exact words from the context whenever possible. Question: {question} Short answer:")
ADVERSARIAL_TEMPLATE = "Based on the above context, answer the following question. Question: {question} Short answer:"
_SESSION = re.compile(r"^session_(\d+)$")
# LoCoMo's evidence lists sometimes pack two ids into one string ("D8:6; D9:17")
_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")


@dataclass(frozen=True)
class LocomoQuestion:
    """One QA item: the question, its reference answer, category and evidence memories."""

    qid: str  # "<sample_id>:<index in the file's qa list>"
    question: str
    answer: str  # category 5: the adversarial answer (the one NOT to give)
    category: int  # 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial
    evidence: tuple[int, ...]  # indices into the conversation's memories, in log order
    evidence_ids: tuple[str, ...]  # the dia_ids as the file gives them


@dataclass(frozen=True)
class LocomoConversation:
    """A conversation as a memory store: its turns as memories (log order) and the questions about them."""

    sample_id: str
    speakers: tuple[str, str]
    memories: tuple[str, ...]
    dia_ids: tuple[str, ...]  # dia_ids[i] is memory i's turn
    questions: tuple[LocomoQuestion, ...]


@dataclass(frozen=True)
class LocomoData:
    """The loaded conversations and the count of each kind of odd item met while loading."""

    conversations: tuple[LocomoConversation, ...]
    oddities: dict[str, int] = field(default_factory=dict)

    @property
    def num_questions(self) -> int:
        return sum(len(c.questions) for c in self.conversations)


def turn_memory(date_time: str, turn: dict) -> str:
    """One turn as a memory: ``[date] Speaker: text``, with a shared image's caption after it."""
    text = " ".join(str(turn.get("text", "")).split())
    caption = turn.get("blip_caption")
    if caption:
        # LoCoMo's own prompts add the caption the same way ("... and shared <caption>")
        text = f"{text} [shared {' '.join(str(caption).split())}]".strip()
    date = f"[{date_time}] " if date_time else ""
    return f"{date}{turn.get('speaker', '?')}: {text}"


def load_locomo(path: Path | str, *, conversations: Collection[str] | None = None,
                categories: Collection[int] | None = None) -> LocomoData:
    """Parse a LoCoMo JSON file (a list of samples) into conversations, keeping the file's order.

    ``conversations`` keeps only those sample_ids, ``categories`` only those question categories.
    Raises ValueError for a file that is not LoCoMo's shape or a requested sample_id it lacks.
    """
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(raw, list) or not all(isinstance(s, dict) and "conversation" in s for s in raw):
        raise ValueError(f"{path} is not a LoCoMo file: it has to be a list of samples with a 'conversation'")
    wanted = set(conversations) if conversations else None
    if wanted is not None:
        missing = sorted(wanted - {str(s.get("sample_id")) for s in raw})
        if missing:
            raise ValueError(f"`conversations` has to name sample_ids of {path} but got {missing}")
    odd: Counter[str] = Counter()
    out = []
    for number, sample in enumerate(raw):
        sample_id = str(sample.get("sample_id", f"sample-{number}"))
        if wanted is not None and sample_id not in wanted:
            continue
        out.append(_conversation(sample_id, sample, categories, odd))
    return LocomoData(conversations=tuple(out), oddities=dict(sorted(odd.items())))


def _conversation(sample_id: str, sample: dict, categories: Collection[int] | None,
                  odd: Counter[str]) -> LocomoConversation:
    conv = sample["conversation"]
    sessions = sorted((int(m.group(1)), key) for key in conv if (m := _SESSION.match(key)))
    memories: list[str] = []
    dia_ids: list[str] = []
    for number, key in sessions:
        turns = conv[key]
        if not isinstance(turns, list):
            odd["session_not_a_list"] += 1
            continue
        date_time = str(conv.get(f"session_{number}_date_time") or "")
        if not date_time:
            odd["session_without_date"] += 1
        for turn in turns:
            if not isinstance(turn, dict) or not str(turn.get("text", "")).strip() and not turn.get("blip_caption"):
                odd["empty_turn"] += 1
                continue
            odd["turn_with_image"] += bool(turn.get("blip_caption"))
            memories.append(turn_memory(date_time, turn))
            dia_ids.append(str(turn.get("dia_id", f"S{number}:{len(memories)}")))
    index = {dia_id: i for i, dia_id in enumerate(dia_ids)}
    questions = []
    for number, item in enumerate(sample.get("qa", [])):
        question = _question(f"{sample_id}:{number}", item, index, odd)
        if question is not None and (categories is None or question.category in categories):
            questions.append(question)
    return LocomoConversation(sample_id=sample_id, speakers=(str(conv.get("speaker_a", "")), str(conv.get("speaker_b", ""))),
                              memories=tuple(memories), dia_ids=tuple(dia_ids), questions=tuple(questions))


def _question(qid: str, item: dict, index: dict[str, int], odd: Counter[str]) -> LocomoQuestion | None:
    category = item.get("category")
    if category not in CATEGORIES or not str(item.get("question", "")).strip():
        odd["qa_skipped_bad_category_or_question"] += 1
        return None
    # the paper's scorer reads 'answer' first, then 'adversarial_answer'; category 5 offers the adversarial one
    keys = ("adversarial_answer", "answer") if category == 5 else ("answer", "adversarial_answer")
    answer = next((item[k] for k in keys if item.get(k) not in (None, "")), None)
    if answer is None:
        odd["qa_skipped_no_answer"] += 1
        return None
    if not isinstance(answer, str):
        odd["answer_not_a_string"] += 1  # e.g. a year given as a number: scored as its str(), like the paper
    evidence: list[int] = []
    raw_ids = [str(e) for e in item.get("evidence") or []]
    for raw in raw_ids:
        parts = [p for p in _EVIDENCE_SPLIT.split(raw) if p]
        if len(parts) > 1:
            odd["evidence_packed_ids"] += 1
        for part in parts:
            if part in index:
                evidence.append(index[part])
            else:
                odd["evidence_unknown_id"] += 1
    if not raw_ids:
        odd["qa_without_evidence"] += 1
    elif not evidence:
        odd["qa_with_no_resolvable_evidence"] += 1
    return LocomoQuestion(qid=qid, question=" ".join(str(item["question"]).split()), answer=str(answer),
                          category=int(category), evidence=tuple(sorted(set(evidence))), evidence_ids=tuple(raw_ids))


def question_prompt(question: LocomoQuestion, *, seed: int = 0,
                    template: str | None = None) -> tuple[str, dict[str, str] | None]:
    """The prompt for ``question`` as LoCoMo's evaluation poses it, and category 5's options ({'a', 'b'}) or None.

    Category 2 asks for an approximate date from the memories' dates; category 5 offers the adversarial answer
    and ``NOT_MENTIONED`` in an order drawn per question from ``seed`` (the paper draws it at random). The
    question is then put in ``template`` (which holds ``{question}``), or by default in the paper's own
    instructions (``QA_TEMPLATE``; ``ADVERSARIAL_TEMPLATE`` for category 5).
    """
    options = None
    posed = question.question
    if question.category == 2:
        posed += TEMPORAL_SUFFIX
    elif question.category == 5:
        rng = random.Random(f"{seed}:{question.qid}")
        pair = [NOT_MENTIONED, question.answer]
        if rng.random() >= 0.5:
            pair.reverse()
        options = {"a": pair[0], "b": pair[1]}
        posed += f" Select the correct answer: (a) {pair[0]} (b) {pair[1]}."
    if template is None:
        template = ADVERSARIAL_TEMPLATE if question.category == 5 else QA_TEMPLATE
    return template.format(question=posed), options


def sample_questions(conversation: LocomoConversation, num_questions: int | None, *,
                     seed: int) -> list[LocomoQuestion]:
    """``num_questions`` of the conversation's questions drawn with ``seed`` (all when None), in file order."""
    questions: Sequence[LocomoQuestion] = conversation.questions
    if num_questions is None or num_questions >= len(questions):
        return list(questions)
    picked = set(random.Random(f"{seed}:{conversation.sample_id}").sample(range(len(questions)), num_questions))
    return [q for i, q in enumerate(questions) if i in picked]
