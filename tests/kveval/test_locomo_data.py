"""Loading LoCoMo: one memory per turn with its session's date and speaker, evidence mapped, odd items counted."""
from __future__ import annotations

import json

import pytest

from kvengine.kveval.locomo import (
    NOT_MENTIONED,
    QA_TEMPLATE,
    TEMPORAL_SUFFIX,
    load_locomo,
    question_prompt,
    sample_questions,
)


def test_it_makes_one_memory_per_turn_with_date_and_speaker_in_log_order(locomo_file):
    conv = load_locomo(locomo_file).conversations[0]
    assert conv.sample_id == "conv-a" and conv.speakers == ("Ann", "Bo")
    assert conv.dia_ids == ("D1:1", "D1:2", "D2:1", "D2:2", "D10:1")
    assert conv.memories == (
        "[1:56 pm on 8 May, 2023] Ann: I adopted a puppy named Rex yesterday.",
        "[1:56 pm on 8 May, 2023] Bo: Lovely! I went hiking in the Alps. [shared a photo of a snowy mountain]",
        "[10:00 am on 9 June, 2023] Bo: I started painting sunsets.",
        "[10:00 am on 9 June, 2023] Ann: My sister Lily visits in July.",
        "[3:00 pm on 1 August, 2023] Ann: Rex learned to sit.",
    )


def test_it_maps_evidence_ids_to_memory_indices(locomo_file):
    questions = {q.question: q for q in load_locomo(locomo_file).conversations[0].questions}
    assert questions["What is the name of Ann's puppy?"].evidence == (0,)
    assert questions["What hobbies does Bo have?"].evidence == (1, 2)
    assert questions["Would Ann like dogs?"].evidence == (0, 4)  # "D1:1; D10:1" packed in one string
    assert questions["Would Ann like dogs?"].evidence_ids == ("D1:1; D10:1",)
    assert questions["In which year did Ann adopt Rex?"].evidence == ()  # D9:99 does not exist


def test_it_takes_answers_by_category_and_keeps_odd_items_without_crashing(locomo_file):
    data = load_locomo(locomo_file)
    conv = data.conversations[0]
    by_question = {q.question: q for q in conv.questions}
    assert "Who visits Ann?" not in by_question  # no answer at all: skipped
    assert by_question["What is Bo's puppy called?"].answer == "Rex"  # category 5: the adversarial answer
    assert by_question["What is Bo's puppy called?"].category == 5
    assert by_question["In which year did Ann adopt Rex?"].answer == "2023"  # a number, kept as its text
    assert [q.qid for q in conv.questions] == ["conv-a:0", "conv-a:1", "conv-a:2", "conv-a:3", "conv-a:4",
                                                "conv-a:6", "conv-a:7"]
    assert data.num_questions == 9
    assert data.oddities == {
        "answer_not_a_string": 1, "empty_turn": 1, "evidence_packed_ids": 1, "evidence_unknown_id": 1,
        "qa_skipped_no_answer": 1, "qa_with_no_resolvable_evidence": 1, "qa_without_evidence": 1,
        "turn_with_image": 1,
    }


def test_it_keeps_only_the_asked_conversations_and_categories(locomo_file):
    data = load_locomo(locomo_file, conversations=["conv-b"], categories=[1])
    assert [c.sample_id for c in data.conversations] == ["conv-b"]
    assert [q.question for q in data.conversations[0].questions] == ["What is Di learning?"]


def test_it_refuses_an_unknown_conversation_and_a_file_of_another_shape(locomo_file, tmp_path):
    with pytest.raises(ValueError, match="`conversations`.*conv-z"):
        load_locomo(locomo_file, conversations=["conv-z"])
    other = tmp_path / "squad.json"
    other.write_text(json.dumps({"data": []}), encoding="utf-8")
    with pytest.raises(ValueError, match="not a LoCoMo file"):
        load_locomo(other)


def test_it_poses_temporal_and_adversarial_questions_as_the_paper_does(locomo_file):
    by_category = {}
    for question in load_locomo(locomo_file).conversations[0].questions:
        by_category.setdefault(question.category, question)
    plain = "{question}"
    assert question_prompt(by_category[2], template=plain) == ("When did Bo start painting?" + TEMPORAL_SUFFIX, None)
    assert question_prompt(by_category[4], template=plain) == ("What is the name of Ann's puppy?", None)
    orders = set()
    for seed in range(8):
        prompt, options = question_prompt(by_category[5], seed=seed, template=plain)
        assert sorted(options.values()) == sorted([NOT_MENTIONED, "Rex"])
        assert prompt == (f"What is Bo's puppy called? Select the correct answer: (a) {options['a']} "
                          f"(b) {options['b']}.")
        assert question_prompt(by_category[5], seed=seed, template=plain) == (prompt, options)  # the same draw for the same seed
        orders.add(options["a"])
    assert orders == {NOT_MENTIONED, "Rex"}  # both orders occur over seeds


def test_it_draws_the_same_questions_for_the_same_seed_in_file_order(locomo_file):
    conv = load_locomo(locomo_file).conversations[0]
    picked = sample_questions(conv, 3, seed=1)
    assert picked == sample_questions(conv, 3, seed=1)
    assert len(picked) == 3 and picked == [q for q in conv.questions if q in picked]
    assert sample_questions(conv, None, seed=1) == list(conv.questions)
    assert sample_questions(conv, 50, seed=1) == list(conv.questions)


def test_it_puts_the_question_in_the_papers_instructions_or_a_given_template(locomo_file):
    question = load_locomo(locomo_file).conversations[1].questions[0]
    assert question_prompt(question) == (QA_TEMPLATE.format(question="What did Cy buy?"), None)
    assert QA_TEMPLATE.startswith("Based on the above context, write an answer in the form of a short phrase")
    assert question_prompt(question, template="Q: {question}") == ("Q: What did Cy buy?", None)
    adversarial = next(q for q in load_locomo(locomo_file).conversations[0].questions if q.category == 5)
    prompt, _ = question_prompt(adversarial)
    assert prompt.startswith("Based on the above context, answer the following question. Question: What is Bo's")
    assert prompt.endswith("Short answer:")
