"""The 32 facts and questions the OpenAI-endpoint tests serve through the fake engine (test_openai*.py, LlamaIndex),
and an ``openai`` client of a user for a live server."""
from __future__ import annotations

import openai

from tests.support.servers import token_for

FACTS = [
    f"{name} keeps the {thing} in the {place}."
    for name in ("Ada", "Bram", "Cleo", "Dov")
    for thing, place in (("red umbrella", "hall cupboard"), ("passport", "desk drawer"), ("bike pump", "garage"),
                         ("spare charger", "kitchen drawer"), ("winter boots", "attic"), ("tax papers", "blue folder"),
                         ("guitar", "spare room"), ("camping stove", "shed"))
]
QUESTIONS = [f"Where does {fact.split()[0]} keep the {fact.split(' the ')[1].split(' in')[0]}?" for fact in FACTS]


def client_for(base_url: str, user) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=token_for(user), max_retries=0, timeout=60)
