"""How an answer is decoded: greedy by default, or sampled, with stop strings, log-probs and a JSON constraint.

Plain values only (no torch): the Django apps build a Decoding from an OpenAI request and the fake backend reads
it. The default (greedy, nothing else) is decoded in the model's batch (batching.py), bit for bit as before; stop
strings also apply there (they only end the text). Anything needing the distribution at each step (sampling,
log-probs, a constraint) is decoded one question at a time on top of the cartridge (sampling.py), the ``n`` choices
of one question together (choices.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

MAX_STOPS = 4  # OpenAI's bound
MAX_TOP_LOGPROBS = 20  # OpenAI's bound


@dataclass(frozen=True)
class Decoding:
    """Decoding options of one answer; the defaults are greedy decoding, as every answer had before."""

    temperature: float = 0.0  # 0: greedy (argmax); above 0: sample from softmax(logits / temperature)
    top_p: float = 1.0  # nucleus sampling: the smallest set of tokens whose probability reaches top_p
    seed: int | None = None  # the sampler's seed: the same seed on the same prompt gives the same answer
    stop: tuple[str, ...] = ()  # the answer ends before the first of these strings
    logprobs: bool = False  # report each answer token's log-prob (the model's, before temperature and top_p)
    top_logprobs: int = 0  # and this many most likely alternatives per position
    json_schema: str | None = None  # canonical JSON of a JSON schema ("{}": any JSON object) the answer must match

    @property
    def per_step(self) -> bool:
        """Whether decoding needs each step's distribution (not the batched greedy path)."""
        return self.temperature > 0 or self.logprobs or self.json_schema is not None

    def for_choice(self, index: int) -> Decoding:
        """The decoding of choice ``index`` of an ``n``-choice answer: seed + index (mod 2**63) when a seed was given,
        so choice i of a seeded request is the answer of one request with seed + i."""
        if not index or self.seed is None:
            return self
        return replace(self, seed=(self.seed + index) % 2**63)

    def as_dict(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed, "stop": list(self.stop),
                "logprobs": self.logprobs, "top_logprobs": self.top_logprobs, "json_schema": self.json_schema}

    @classmethod
    def of_dict(cls, data: dict) -> Decoding:
        return cls(**{**data, "stop": tuple(data.get("stop") or ())})


GREEDY = Decoding()


@dataclass(frozen=True)
class TokenLogprob:
    """One answer token's log-prob and the most likely alternatives at its position (``top``: (token, logprob))."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = field(default=())


class StopWatcher:
    """Ends a text stream before the first stop string: feed deltas, get what may be shown.

    Text that could be the beginning of a stop string is held back until it cannot be (or the stream ends).
    """

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.text = ""  # everything shown so far (the answer text, before stripping)
        self.held = ""
        self.hit = False

    def feed(self, delta: str) -> str:
        """The part of ``delta`` (with what was held) that may be shown now; sets ``hit`` at a stop string."""
        if self.hit:
            return ""
        pending = self.held + delta
        cut = min((i for i in (pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit, self.held = True, ""
            return self._show(pending[:cut])
        keep = max((k for s in self.stops for k in range(1, len(s)) if pending.endswith(s[:k])), default=0)
        self.held = pending[len(pending) - keep :] if keep else ""
        return self._show(pending[: len(pending) - keep])

    def flush(self) -> str:
        """The stream ended without a stop string: what was held back."""
        held, self.held = ("", "") if self.hit else (self.held, "")
        return self._show(held)

    def _show(self, text: str) -> str:
        self.text += text
        return text


class TextStream:
    """An answer's text as its tokens come: ``push`` a token, get the text it adds (a token that ends inside a UTF-8
    character waits for the next); ``stopped`` once the text reached a stop string (take no more tokens); ``end``
    gives what the last tokens completed. Appends each token to ``ids``; the watcher holds the shown text."""

    def __init__(self, tokenizer: Any, ids: list[int], watcher: StopWatcher | None = None):
        self.tokenizer, self.ids, self.watcher = tokenizer, ids, watcher
        self.shown = ""
        self.stopped = False

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not (len(text) > len(self.shown) and text.startswith(self.shown)):
            return ""  # a multi-byte character split across tokens: wait for its end
        delta, self.shown = text[len(self.shown):], text
        if self.watcher is None:
            return delta
        out = self.watcher.feed(delta)
        self.stopped = self.watcher.hit
        return out

    def end(self) -> str:
        """The tokens ended without a stop string: the rest of the text."""
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        tail = full[len(self.shown):] if len(full) > len(self.shown) and full.startswith(self.shown) else ""
        if self.watcher is not None:
            tail = self.watcher.feed(tail) + ("" if self.watcher.hit else self.watcher.flush())
        return tail
