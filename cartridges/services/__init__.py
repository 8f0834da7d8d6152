"""The cartridge lifecycle's writes (HackSoftware style: views, commands and tasks call these)."""
from __future__ import annotations

from .activate import cartridge_activate, cartridge_rollback
from .answer import AnswerResult, cartridge_answer, cartridge_answer_choices, question_validate
from .answer_requests import answer_request_answer, answer_request_collect, answer_request_file, answer_requests_sweep
from .ask import AskOptions, prompt_build
from .cases import evaluation_case_add, evaluation_case_subjects_resolve
from .compile import RebuildResult, cartridge_compile, cartridge_rebuild, head_validate
from .config import kv_configuration_switch
from .destroy import cartridge_destroy
from .erase import cartridge_views_rebuild
from .errors import ContextTooLong, GateFailed, NoActiveCartridge, NothingToCompile
from .forget import answer_requests_discard, evaluation_cases_forget
from .gate import GateResult, cartridge_evaluate, cartridge_is_committable
from .scope_settings import scope_settings_update

__all__ = [
    "AskOptions", "prompt_build", "AnswerResult", "answer_request_answer", "answer_request_collect", "answer_request_file", "ContextTooLong", "GateFailed", "GateResult", "NoActiveCartridge", "NothingToCompile",
    "RebuildResult", "cartridge_activate", "cartridge_answer", "cartridge_answer_choices", "cartridge_compile", "cartridge_destroy",
    "cartridge_evaluate", "cartridge_is_committable", "cartridge_rebuild", "cartridge_rollback",
    "cartridge_views_rebuild", "evaluation_case_add", "head_validate", "kv_configuration_switch",
    "question_validate", "answer_requests_discard", "answer_requests_sweep", "evaluation_case_subjects_resolve",
    "evaluation_cases_forget", "scope_settings_update",
]
