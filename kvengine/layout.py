"""The prompt layout: where memories, the question and the chat template's scaffolding sit in the prompt.

The memories sit in the chat template's system turn, the question in the user turn. A cartridge is the KV
state of exactly the token prefix up to where the question's words start; answering feeds only the rest on
top of it, and re-reading renders the same tokens in one go. A conversation's turns follow the prefix, the
client's system text folded into the first user turn. Models without a chat template get a plain layout
split at a newline; ``check_split`` lets compile() refuse a tokenizer that breaks the split.

Everything here is text and token ids. Changing any string below changes the template fingerprint, so bump
LAYOUT_VERSION with it: cartridges compiled under the other layout then stop matching.
Design: docs/design/prompt-layout.md.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from .base import canonical_json
from .conversation import Conversation, Prompt, Turn
from .errors import EmptyInputError, KvError

LAYOUT_VERSION = "mnesio-layout-v2"  # bump when the prompt layout below changes: it invalidates cartridges
SYSTEM_PREAMBLE = "Answer the user's question using these memories.\nMemories:\n"
PLAIN_QUESTION = "Question: {question}\nAnswer:"
PROBE_QUESTION = "Is this a probe question?"
# Questions opening with each kind of character (letter, digit, punctuation, quote, non-Latin script): the
# opener split is kept only if none of them merges with the opener's last token (see _splits_cleanly).
SPLIT_PROBES = (PROBE_QUESTION, "1999?", "'s it?", '"Quoted"?', "...and?", "-x?", "¿Dónde?", "東京は?", "Ünïcode?")
_SENTINEL = "\x00mnesio-question\x00"  # marks where the user content goes; never tokenized


class PromptLayout:
    """The prompt texts and token ids for one tokenizer (and its chat template, if it has one).

    Thread safety: the opener split is computed once, lazily; computing it twice gives the same value, so
    concurrent first calls are harmless. Everything else is read-only.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.template: str | None = getattr(tokenizer, "chat_template", None) or None
        self._split: tuple[str, str] | None = None  # see turn_split()
        # longest first, so a special token that contains another is removed whole
        self._specials = sorted({str(token) for token in tokenizer.all_special_tokens if token}, key=len, reverse=True)

    def fingerprint(self) -> str:
        """sha256 over everything that shapes the prompt: the layout version, template, preamble and plain layout."""
        layout = canonical_json({"layout": LAYOUT_VERSION, "template": self.template, "preamble": SYSTEM_PREAMBLE, "plain": PLAIN_QUESTION})
        return hashlib.sha256(layout.encode()).hexdigest()

    # -- user text ---------------------------------------------------------------------------------
    def clean(self, text: str) -> str:
        """Strip whitespace and special-token strings so user text cannot forge template structure."""
        for special in self._specials:
            text = text.replace(special, "")
        return text.strip()

    def clean_memories(self, texts: Sequence[str]) -> list[str]:
        """The memories as they go into the prompt (cleaned, empty ones dropped); refuse when none is left."""
        if isinstance(texts, str):
            raise EmptyInputError("`texts` has to be a list of memory strings, not one string")
        cleaned = [self.clean(text) for text in texts if isinstance(text, str)]
        cleaned = [text for text in cleaned if text]
        if not cleaned:
            raise EmptyInputError("`texts` has to hold at least one non-empty memory but got none")
        return cleaned

    def memory_positions(self, texts: Sequence[str], prefix: str, ids: list[int]) -> list[int]:
        """For each of ``texts`` (as given, before cleaning), the first token position its text can influence.

        That is the token holding the separator before the memory (so a merge of the separator with the
        memory's first characters is counted in), found through the tokenizer's character offsets in the
        prefix text. A text dropped by cleaning takes the position of the memory after it (it adds no token).
        Erasure uses it to keep the blocks before the first one a memory reaches (blocks.py).
        """
        cleaned = [self.clean(text) if isinstance(text, str) else "" for text in texts]
        body = SYSTEM_PREAMBLE + "\n".join(text for text in cleaned if text)
        start = prefix.find(body)
        offsets = self.tokenizer(prefix, add_special_tokens=False, return_offsets_mapping=True).get("offset_mapping")
        if start < 0 or not offsets or len(offsets) != len(ids):
            return [0] * len(texts)  # cannot place them: every block counts as reached (erasure recomputes all)
        ends = [end for _, end in offsets]
        positions, char = [], start + len(SYSTEM_PREAMBLE)
        for text in cleaned:
            anchor = max(char - 1, 0)  # the separator before the memory (the preamble's newline for the first)
            positions.append(next((i for i, end in enumerate(ends) if end > anchor), len(ids)))
            if text:
                char += len(text) + 1
        return positions

    def clean_question(self, question: Prompt) -> Prompt:
        """The question (or conversation) as it goes into the prompt (cleaned); refuse an empty one.

        A conversation of one user turn and no system text is that plain question (the same prompt, bit for bit).
        """
        if isinstance(question, Conversation):
            turns = tuple(Turn(t.role, self.clean_question(t.content)) for t in question.turns)
            cleaned = Conversation(turns=turns, system=self.clean(question.system))
            if cleaned.is_single_question:
                return cleaned.question
            if not self.template:
                raise KvError("this model has no chat template: it answers a single question, not a conversation")
            return cleaned
        cleaned = self.clean(question) if isinstance(question, str) else ""
        if not cleaned:
            raise EmptyInputError("`question` has to be a non-empty string")
        return cleaned

    # -- prompt text -------------------------------------------------------------------------------
    def prefix_text(self, memories: list[str]) -> str:
        """The prompt text the cartridge holds: the system turn with ``memories`` (cleaned) and the user-turn opener."""
        system = SYSTEM_PREAMBLE + "\n".join(memories)
        if self.template:
            return self._chat([{"role": "system", "content": system}], generation_prompt=False) + self.turn_split()[0]
        return system + "\n"

    def closing_text(self) -> str:
        """The prefix text after the last memory: the end of the system turn and the user-turn opener (the tail's end)."""
        if self.template:
            system = self._chat([{"role": "system", "content": _SENTINEL}], generation_prompt=False)
            _, found, after = system.partition(_SENTINEL)
            return (after if found else "") + self.turn_split()[0]
        return "\n"

    def suffix_text(self, question: Prompt) -> str:
        """The prompt text after the cartridge prefix: the question, the end of the user turn and the generation prompt
        (for a conversation: its turns, the first one's opener excepted, and the generation prompt)."""
        if isinstance(question, Conversation):
            system = [{"role": "system", "content": "x"}]
            head = self._chat(system, generation_prompt=False) + self.turn_split()[0]
            full = self._chat([*system, *question.messages()], generation_prompt=True)
            if not full.startswith(head):
                raise KvError("this model's chat template does not render a conversation after the memories' prefix")
            return full[len(head) :]
        if self.template:
            opener, closer = self.turn_split()
            if not opener:  # whole-turn layout: render the user turn around this question
                system = [{"role": "system", "content": "x"}]
                head = self._chat(system, generation_prompt=False)
                return self._chat([*system, {"role": "user", "content": question}], generation_prompt=True)[len(head) :]
            return question + closer
        return PLAIN_QUESTION.format(question=question)

    def full_text(self, memories: list[str], question: Prompt) -> str:
        """The whole prompt text re-reading would feed (rendered in one go, not by concatenation)."""
        if self.template:
            system = SYSTEM_PREAMBLE + "\n".join(memories)
            turns = question.messages() if isinstance(question, Conversation) else [{"role": "user", "content": question}]
            return self._chat([{"role": "system", "content": system}, *turns], generation_prompt=True)
        return self.prefix_text(memories) + self.suffix_text(question)

    def no_memory_text(self, question: Prompt) -> str:
        """The prompt for ``question`` with no memories at all (the model's default system turn): the floor."""
        if self.template:
            turns = question.messages() if isinstance(question, Conversation) else [{"role": "user", "content": question}]
            return self._chat(turns, generation_prompt=True)
        return self.suffix_text(question)

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered prompt text (the template already holds the special tokens)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def check_split(self, memories: list[str], prefix_ids: list[int]) -> None:
        """Refuse a tokenizer for which the whole prompt is not ``prefix_ids`` followed by the question's suffix."""
        probe = self.encode(self.full_text(memories, PROBE_QUESTION))
        if probe[: len(prefix_ids)] != prefix_ids or probe[len(prefix_ids) :] != self.encode(self.suffix_text(PROBE_QUESTION)):
            raise KvError("the prompt does not tokenize as cartridge prefix + question suffix for this tokenizer")

    # -- the opener split --------------------------------------------------------------------------
    def turn_split(self) -> tuple[str, str]:
        """The chat template's text around the user turn's content: (opener, closer).

        The opener (``<|im_start|>user\\n`` for ChatML) does not depend on the question, so it belongs to the
        cartridge prefix: every question then feeds only its own words and the closer (the end of the user
        turn and the generation prompt). Templates whose user turn cannot be split that way (the content is
        transformed, or the opener does not tokenize as a prefix) keep the whole user turn in the suffix.
        """
        if self._split is None:
            system = [{"role": "system", "content": "x"}]
            head = self._chat(system, generation_prompt=False)
            full = self._chat([*system, {"role": "user", "content": _SENTINEL}], generation_prompt=True)
            if not full.startswith(head):
                raise KvError("this model's chat template does not render the system turn as a prefix; it cannot hold cartridges")
            turn = full[len(head) :]
            opener, found, closer = turn.partition(_SENTINEL)
            split = (opener, closer) if found and _SENTINEL not in closer else ("", "")
            if split[0] and not self._splits_cleanly(head, *split):
                split = ("", "")
            self._split = split  # ("", "") falls back to the whole user turn in the suffix
        return self._split

    def _splits_cleanly(self, head: str, opener: str, closer: str) -> bool:
        """Whether head + opener + question + closer tokenizes as (head + opener) then (question + closer).

        Checked for every question in SPLIT_PROBES: a tokenizer that merges the opener's last character with
        any of them keeps the whole user turn in the suffix instead.
        """
        left = self.encode(head + opener)
        for question in SPLIT_PROBES:
            whole = self.encode(head + opener + question + closer)
            if whole[: len(left)] != left or whole[len(left) :] != self.encode(question + closer):
                return False
        return True

    def _chat(self, messages: list[dict[str, str]], *, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
