"""What the routed functions use of the backend they are given: TransformersKvBackend, through RoutedMixin.

A Protocol, so this package names the backend's surface without importing the backend (which imports the
package for its mixin).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..base import Answer
from ..layout import PromptLayout


class RoutedHost(Protocol):
    """The attributes and methods of TransformersKvBackend that chunks.py and answering.py call."""

    model: Any  # the transformers causal LM
    layout: PromptLayout
    device: str
    dtype: str
    torch_dtype: torch.dtype
    _eos_ids: set[int]
    _check_room: Callable[..., None]  # (num_prompt, max_new_tokens, what): raises past the context window
    _greedy: Callable[..., Any]  # greedy decoding from a cache (kvengine/answering.py)
    _answer: Callable[..., Answer]  # an Answer from decoded ids and timings (kvengine/answering.py)
