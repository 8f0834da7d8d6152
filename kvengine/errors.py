"""Engine errors: each says what was wrong, which value, and what to do. Never imports Django."""
from __future__ import annotations


class KvError(Exception):
    """Base class of every error the engine raises on purpose."""


class EmptyInputError(KvError, ValueError):
    """An empty memory list or an empty question."""


class ContextTooLongError(KvError, ValueError):
    """The memories do not fit the model's context window."""

    def __init__(self, *, num_tokens: int, limit: int, what: str = "memories"):
        self.num_tokens = num_tokens
        self.limit = limit
        super().__init__(
            f"the {what} take {num_tokens} tokens but the model's context window allows {limit}; "
            "split the scope or compile fewer memories"
        )


class CorruptCartridgeError(KvError, ValueError):
    """A cartridge file that is truncated, malformed, or whose payload hash does not match."""


class IncompatibleCartridgeError(KvError, ValueError):
    """A cartridge compiled for another model, tokenizer, template, rope config, dtype or quant."""


class ModelUnavailableError(KvError, RuntimeError):
    """The model weights are not present locally and cannot be fetched (offline)."""


class ConfigError(KvError, ValueError):
    """A backend option outside its allowed values."""


class OverloadedError(KvError, RuntimeError):
    """Too many questions are already waiting in this process; ask again after ``retry_after_s`` seconds.

    Raised instead of queueing without bound (back-pressure); the web tier answers it with 429 + Retry-After.
    """

    def __init__(self, *, waiting: int, limit: int, retry_after_s: float):
        self.waiting = waiting
        self.limit = limit
        self.retry_after_s = retry_after_s
        super().__init__(
            f"{waiting} questions are already waiting in this process (the limit is {limit}); "
            f"ask again in {retry_after_s:.0f} s"
        )
