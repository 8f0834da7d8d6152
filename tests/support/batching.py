"""What the batched-decoding tests (tests/kvengine/test_batching*.py) share: their memories, questions and a wait."""
from __future__ import annotations

import time

MEMORIES = [
    "Alice Moreau lives in Lisbon and works as a baker at the corner shop on Rua Augusta.",
    "Bob Tanaka keeps the spare key to the office under the blue flower pot by the back door.",
    "The quarterly review meeting with Carol is on Friday at three in the afternoon, in room 4B.",
    "Eva prefers her coffee black with no sugar, and she is allergic to peanuts.",
]
OTHER_MEMORIES = [
    "Farid drives a green 2009 Volvo estate and parks it in space number 17.",
    "The company's annual retreat will take place in Porto from the 12th to the 14th of June.",
]
QUESTIONS = ["Where does Alice live?", "Where is the spare key?", "When is the meeting with Carol?", "What is Eva allergic to?",
             "Who is Bob?", "What does Alice do?"]


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
