"""Decoding one answer step by step with its distribution: sampling, log-probs and a JSON constraint.

The batched path (batching.py) decodes greedily and hands back token ids only. An answer that samples
(``temperature`` > 0, ``top_p``, ``seed``), reports log-probs or must match a JSON schema is decoded here, one
question at a time on top of the cartridge's scratch tail, like TransformersKvBackend.answer_stream_unbatched; the
``n`` choices of one such question are decoded together, each row with its own Sampler (choices.py).
Sampling draws from a torch.Generator seeded with ``seed`` (a fresh random seed without one) on the CPU, so the
same seed on the same prompt gives the same answer. Reported log-probs are the model's (log-softmax of its
logits, before temperature and top_p), as vLLM reports them by default.

The JSON constraint is lm-format-enforcer's (a maintained, pure-Python library; imported lazily): at each step
only tokens that keep the text a valid prefix of a document matching the schema are allowed, and the end of the
turn only where the document is complete. Its per-tokenizer table takes a few seconds to build, once per backend.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .decoding import Decoding, TokenLogprob
from .errors import ConfigError


@dataclass
class Step:
    """One decoded token and, when asked for, its log-prob entry."""

    token: int
    logprob: TokenLogprob | None


class JsonConstraint:
    """The tokens allowed next for a JSON answer matching a schema (lm-format-enforcer's TokenEnforcer)."""

    _tables: dict[int, Any] = {}
    _lock = threading.Lock()

    def __init__(self, tokenizer: Any, schema_json: str, eos_ids: set[int]):
        try:
            from lmformatenforcer import JsonSchemaParser, TokenEnforcer
        except ImportError as exc:  # an optional dependency: say which
            raise ConfigError("a JSON `response_format` needs lm-format-enforcer: pip install lm-format-enforcer==0.11.3") from exc
        schema = json.loads(schema_json)
        try:
            parser = JsonSchemaParser(schema or None)  # None: any JSON object
        except Exception as exc:  # its schema model's ValidationError, ValueError, ...: a schema it cannot take
            raise ConfigError(f"`json_schema` is not a schema lm-format-enforcer can constrain to: {str(exc)[:200]}") from None
        self.enforcer = TokenEnforcer(self._table(tokenizer, eos_ids), parser)
        self.eos_ids = eos_ids

    @classmethod
    def _table(cls, tokenizer: Any, eos_ids: set[int]) -> Any:
        """The per-tokenizer table (what lm-format-enforcer's transformers integration builds; that module does not
        import under transformers 5)."""
        from lmformatenforcer import TokenEnforcerTokenizerData

        with cls._lock:
            if id(tokenizer) not in cls._tables:
                zero = tokenizer.encode("0", add_special_tokens=False)[-1]
                specials, regular = set(tokenizer.all_special_ids), []
                for token_id in range(len(tokenizer)):
                    if token_id in specials:
                        continue
                    # decoded after "0" keeps a word-start token's leading space, which decoding it alone drops
                    after_zero = tokenizer.decode([zero, token_id])[1:]
                    regular.append((token_id, after_zero, len(after_zero) > len(tokenizer.decode([token_id]))))
                cls._tables[id(tokenizer)] = TokenEnforcerTokenizerData(
                    regular, lambda ids: tokenizer.decode(ids).rstrip("\ufffd"), sorted(eos_ids), False, len(tokenizer))
            return cls._tables[id(tokenizer)]

    def mask(self, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with every token the schema does not allow after ``generated`` set to -inf."""
        allowed = self.enforcer.get_allowed_tokens(list(generated)).allowed_tokens
        masked = torch.full_like(logits, float("-inf"))
        index = torch.tensor(allowed, dtype=torch.long, device=logits.device)
        masked[index] = logits[index]
        return masked


def _choose(logits: torch.Tensor, decoding: Decoding, generator: torch.Generator | None) -> int:
    """Argmax when greedy; else a draw from softmax(logits / temperature) restricted to the top_p nucleus."""
    if decoding.temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float().cpu() / decoding.temperature, dim=-1)  # (vocab,)
    if decoding.top_p < 1:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs  # mass of the tokens ranked above each one
        sorted_probs[before >= decoding.top_p] = 0  # keep the smallest set reaching top_p (the first always stays)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def _logprob(tokenizer: Any, logp: torch.Tensor, token: int, top: int) -> TokenLogprob:
    alternatives: tuple[tuple[str, float], ...] = ()
    if top:
        values, ids = logp.topk(top)
        alternatives = tuple((tokenizer.decode([int(i)]), float(v)) for v, i in zip(values.tolist(), ids.tolist(), strict=True))
    return TokenLogprob(token=tokenizer.decode([token]), logprob=float(logp[token]), top=alternatives)


class Sampler:
    """One answer's choice of each next token: its generator (seeded with ``seed``, else a fresh random seed), its JSON
    constraint, log-prob entries; decode_steps and the batched choices (choices.py) share it, so a row of a batch
    draws exactly what the same answer decoded alone draws from the same logits."""

    def __init__(self, tokenizer: Any, decoding: Decoding, *, eos_ids: set[int], stop_at_eos: bool = True):
        self.tokenizer, self.decoding, self.eos_ids, self.stop_at_eos = tokenizer, decoding, eos_ids, stop_at_eos
        self.generator = None
        if decoding.temperature > 0:
            self.generator = torch.Generator(device="cpu")
            if decoding.seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(decoding.seed)
        self.constraint = JsonConstraint(tokenizer, decoding.json_schema, eos_ids) if decoding.json_schema is not None else None
        self.generated: list[int] = []

    def choose(self, logits: torch.Tensor) -> Step | None:
        """The next token from ``logits`` (vocab,) float32, or None at the end of the turn."""
        shaped = self.constraint.mask(self.generated, logits) if self.constraint is not None else logits
        token = _choose(shaped, self.decoding, self.generator)
        if self.stop_at_eos and token in self.eos_ids:
            return None
        entry = None
        if self.decoding.logprobs:
            entry = _logprob(self.tokenizer, torch.log_softmax(logits, dim=-1), token, self.decoding.top_logprobs)
        self.generated.append(token)
        return Step(token, entry)


def decode_steps(model: Any, tokenizer: Any, ids: list[int], cache: Any, *, max_new_tokens: int, decoding: Decoding,
                 eos_ids: set[int], device: str, stop_at_eos: bool = True, forward: Any = None) -> Iterator[Step]:
    """Run ``ids`` on top of ``cache``, then decode up to ``max_new_tokens`` tokens as ``decoding`` says; ``forward``
    (by default ``model``) runs each single-token step (kvengine.compiled)."""
    step_forward = model if forward is None else forward
    sampler = Sampler(tokenizer, decoding, eos_ids=eos_ids, stop_at_eos=stop_at_eos)
    input_ids = torch.tensor([ids], device=device)  # (1, num_ids)
    logits = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float()  # (vocab,)
    while True:
        step = sampler.choose(logits)
        if step is None:
            return
        yield step
        if len(sampler.generated) >= max_new_tokens:
            return
        logits = step_forward(input_ids=torch.tensor([[step.token]], device=device), cache=cache, use_cache=True).logits[0, -1].float()
