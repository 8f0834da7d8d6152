"""The gate, by concern: committable.py runs it and records evaluations (its docstring lists every check and when
each gate runs); checks.py holds what both gates share, full.py the full gate's model checks, incremental.py
the incremental gate. Every public name is importable from ``cartridges.services.gate``.
"""
from __future__ import annotations

from kvengine.retrieval import bm25_top_k
from kvengine.text import answer_correct

from .checks import GateResult, auto_probes
from .committable import GATES, cartridge_evaluate, cartridge_is_committable, evaluation_record
from .incremental import MAX_PARENT_CANDIDATES

__all__ = [
    "GATES", "MAX_PARENT_CANDIDATES", "GateResult", "answer_correct", "auto_probes", "bm25_top_k", "cartridge_evaluate",
    "cartridge_is_committable", "evaluation_record",
]
