"""A typed Python client of mnesio's API: ``MnesioClient(base_url, token)`` (docs/agent-developers.md)."""
from __future__ import annotations

from .client import AnswerStream, MnesioClient
from .errors import MnesioError
from .models import (
    Answer,
    BatchItem,
    BatchResult,
    ErasureEvent,
    ErasureRequest,
    Memory,
    MemoryInput,
    MemoryPage,
    NewToken,
    Scope,
    SearchHit,
    SearchResult,
    Token,
    Turn,
)

__all__ = [
    "Answer", "AnswerStream", "BatchItem", "BatchResult", "ErasureEvent", "ErasureRequest", "Memory", "MemoryInput",
    "MemoryPage", "MnesioClient", "MnesioError", "NewToken", "Scope", "SearchHit", "SearchResult", "Token", "Turn",
]
