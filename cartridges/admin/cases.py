"""Evaluation cases (attached through the service, sealed) and answer records (timings only)."""
from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from cartridges import selectors, services
from cartridges.models import AnswerRecord, EvaluationCase
from core.errors import MnesioError

from .common import ReadOnlyAdmin


class EvaluationCaseForm(forms.ModelForm):
    question = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}))
    answers = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), help_text="One accepted answer per line.")
    subject_ids = forms.CharField(
        label="Subjects", required=False, widget=forms.Textarea(attrs={"rows": 2}),
        help_text="External ids of the people this case concerns, one per line (subjects whose memories quote an "
                  "answer are linked automatically). Erasing any of them erases the case.",
    )

    class Meta:
        model = EvaluationCase
        fields = ["scope"]

    def clean_question(self) -> str:
        # The service's own validation (MNESIO_MAX_QUESTION_CHARS, not blank), as a form error instead of a 500.
        try:
            return services.question_validate(self.cleaned_data["question"])
        except MnesioError as exc:
            raise forms.ValidationError(exc.message) from None

    def clean_answers(self) -> list[str]:
        answers = [line.strip() for line in self.cleaned_data["answers"].splitlines() if line.strip()]
        if not answers:
            raise forms.ValidationError("Give at least one accepted answer.")
        return answers

    def clean_subject_ids(self) -> list[str]:
        return [line.strip() for line in self.cleaned_data["subject_ids"].splitlines() if line.strip()]

    def clean(self) -> dict[str, Any]:
        """Refuse subjects that are not in the scope (or erased) here, with the service's own message."""
        data = super().clean()
        if data.get("scope") is not None and data.get("subject_ids"):
            try:
                services.evaluation_case_subjects_resolve(scope=data["scope"], subjects=data["subject_ids"])
            except MnesioError as exc:
                self.add_error("subject_ids", exc.message)
        return data


@admin.register(EvaluationCase)
class EvaluationCaseAdmin(admin.ModelAdmin):
    """Operators attach cases for the gate here (through the service); cases are not edited afterwards.

    The question and answers are sealed: the list opens them (one key unwrap per row); an erased case shows
    as erased with no text.
    """

    form = EvaluationCaseForm
    list_display = ["id", "scope", "question_text", "answers_text", "subject_list", "erased_at", "created_by", "created_at"]
    list_filter = ["scope"]
    list_select_related = ["scope", "created_by"]
    _shown = ["scope", "question_text", "answers_text", "subject_list", "erased_at", "created_by", "created_at"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["scope", "question", "answers", "subject_ids"] if obj is None else self._shown

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else self._shown

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="question")
    def question_text(self, obj: EvaluationCase) -> str:
        return selectors.evaluation_case_open(case=obj).question or "(erased)"

    @admin.display(description="answers")
    def answers_text(self, obj: EvaluationCase) -> str:
        answers = selectors.evaluation_case_open(case=obj).answers
        return "(erased)" if answers is None else "; ".join(answers)

    @admin.display(description="subjects")
    def subject_list(self, obj: EvaluationCase) -> str:
        return ", ".join(obj.subjects.values_list("external_id", flat=True))

    def save_model(self, request: HttpRequest, obj: EvaluationCase, form: forms.Form, change: bool) -> None:
        case = services.evaluation_case_add(
            scope=obj.scope, question=form.cleaned_data["question"], answers=form.cleaned_data["answers"],
            subjects=form.cleaned_data["subject_ids"] or None, actor=request.user,
        )
        obj.pk, obj.created_at, obj.created_by = case.pk, case.created_at, case.created_by
        obj._state.adding = False

    def save_related(self, request: HttpRequest, form: forms.Form, formsets: Any, change: bool) -> None:
        """The service linked the subjects already; the form has no model relation of its own to save."""


@admin.register(AnswerRecord)
class AnswerRecordAdmin(ReadOnlyAdmin):
    """That a question was answered (version, mode, timings); the question and answer are never stored."""

    list_display = ["id", "scope", "mode", "version", "ttft_s", "total_s", "num_context_tokens", "actor", "created_at"]
    list_filter = ["scope", "mode"]
    list_select_related = ["scope", "actor"]
