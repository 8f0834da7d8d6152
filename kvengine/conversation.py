"""The client's part of a prompt: its system text and its turns, placed after the memories' system turn.

A question is a ``str`` (one user turn) or a Conversation. layout.py renders a Conversation after the cartridge
prefix (the memories' system turn and the user-turn opener), so the memories stay a cached prefix whatever the
conversation is, as vLLM's prefix caching keeps a shared system prompt. Because the prefix already opens the first
user turn, the client's system text cannot be a turn of its own before it: it is folded into the first user turn,
ahead of the user's words (``SYSTEM_FOLD``). Plain value types only (no torch), so the fake backend and the Django
apps use them too.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import EmptyInputError

ROLES = ("user", "assistant")
SYSTEM_FOLD = "{system}\n\n{content}"  # the first user turn's content when the client sent system text


@dataclass(frozen=True)
class Turn:
    """One turn of the conversation after the memories: ``role`` is "user" or "assistant"."""

    role: str
    content: str


@dataclass(frozen=True)
class Conversation:
    """Turns from the first user turn to the last (the question), and the client's system text ("" for none)."""

    turns: tuple[Turn, ...]
    system: str = ""

    def __post_init__(self) -> None:
        if not self.turns or not all(isinstance(t, Turn) and t.role in ROLES for t in self.turns):
            raise EmptyInputError(f"a conversation has to hold turns whose role is one of {list(ROLES)}")
        if self.turns[0].role != "user" or self.turns[-1].role != "user":
            raise EmptyInputError("a conversation has to begin and end with a user turn")

    @property
    def question(self) -> str:
        """The last user turn: what is being answered."""
        return self.turns[-1].content

    @property
    def is_single_question(self) -> bool:
        """One user turn and no system text: the same prompt as the plain question."""
        return len(self.turns) == 1 and not self.system

    def messages(self) -> list[dict[str, str]]:
        """The turns as chat-template messages, the system text folded into the first user turn."""
        out = [{"role": t.role, "content": t.content} for t in self.turns]
        if self.system:
            out[0]["content"] = SYSTEM_FOLD.format(system=self.system, content=out[0]["content"])
        return out

    def as_dict(self) -> dict:
        return {"system": self.system, "turns": [[t.role, t.content] for t in self.turns]}

    @classmethod
    def of_dict(cls, data: dict) -> Conversation:
        return cls(turns=tuple(Turn(role, content) for role, content in data["turns"]), system=data.get("system", ""))


Prompt = str | Conversation


def question_text(prompt: Prompt) -> str:
    """The question a prompt asks (the last user turn of a conversation)."""
    return prompt.question if isinstance(prompt, Conversation) else prompt
