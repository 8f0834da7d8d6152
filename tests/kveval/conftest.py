"""A tiny synthetic file in LoCoMo's shape (the real data set is CC BY-NC: it never enters the repository)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

# conv-a's turns become memories 0..4 in this order: D1:1, D1:2, D2:1, D2:2, D10:1 (D1:3 is empty: skipped)
SYNTHETIC_LOCOMO = [
    {
        "sample_id": "conv-a",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bo",
            # session_10 sorts after session_2: sessions are ordered by number, not by key text
            "session_10_date_time": "3:00 pm on 1 August, 2023",
            "session_10": [{"speaker": "Ann", "dia_id": "D10:1", "text": "Rex learned to sit."}],
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a puppy named Rex yesterday."},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely! I went hiking  in the Alps.",
                 "img_url": ["https://example.invalid/alps.jpg"], "blip_caption": "a photo of a snowy mountain",
                 "query": "alps"},
                {"speaker": "Ann", "dia_id": "D1:3", "text": "  "},
            ],
            "session_2_date_time": "10:00 am on 9 June, 2023",
            "session_2": [
                {"speaker": "Bo", "dia_id": "D2:1", "text": "I started painting sunsets."},
                {"speaker": "Ann", "dia_id": "D2:2", "text": "My sister Lily visits in July."},
            ],
        },
        "qa": [
            {"question": "What is the name of Ann's puppy?", "answer": "Rex", "evidence": ["D1:1"], "category": 4},
            {"question": "What hobbies does Bo have?", "answer": "hiking, painting", "evidence": ["D1:2", "D2:1"],
             "category": 1},
            {"question": "When did Bo start painting?", "answer": "9 June 2023", "evidence": ["D2:1"], "category": 2},
            {"question": "Would Ann like dogs?", "answer": "Yes; she adopted a puppy", "evidence": ["D1:1; D10:1"],
             "category": 3},
            {"question": "What is Bo's puppy called?", "adversarial_answer": "Rex", "evidence": ["D1:1"],
             "category": 5},
            {"question": "Who visits Ann?", "evidence": ["D2:2"], "category": 4},
            {"question": "In which year did Ann adopt Rex?", "answer": 2023, "evidence": ["D9:99"], "category": 4},
            {"question": "When does Lily visit?", "answer": "July", "evidence": [], "category": 2},
        ],
        "event_summary": {}, "observation": {}, "session_summary": {},
    },
    {
        "sample_id": "conv-b",
        "conversation": {
            "speaker_a": "Cy",
            "speaker_b": "Di",
            "session_1_date_time": "9:00 am on 2 January, 2024",
            "session_1": [
                {"speaker": "Cy", "dia_id": "D1:1", "text": "I bought a red bicycle."},
                {"speaker": "Di", "dia_id": "D1:2", "text": "I am learning to bake bread."},
            ],
        },
        "qa": [
            {"question": "What did Cy buy?", "answer": "a red bicycle", "evidence": ["D1:1"], "category": 4},
            {"question": "What is Di learning?", "answer": "baking bread", "evidence": ["D1:2"], "category": 1},
        ],
    },
]


@pytest.fixture
def locomo_file(tmp_path: Path) -> Path:
    path = tmp_path / "locomo_synthetic.json"
    path.write_text(json.dumps(SYNTHETIC_LOCOMO), encoding="utf-8")
    return path
