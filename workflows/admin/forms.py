"""Forms of the operator console. They parse and shape input only; the engine
validates payloads (with the workflow's own serializer, exactly as the API
does) and decides."""

from __future__ import annotations

import json
import uuid

from django import forms

from workflows.errors import (
    IdempotencyKeyInvalid,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    PayloadTooLarge,
    PilotError,
    UnknownWorkflow,
    ValidationFailed,
)
from workflows.registry import registry


def _workflow_choices():
    return [(name, name) for name in registry.names()]


def _fresh_key() -> str:
    return str(uuid.uuid4())


class TriggerForm(forms.Form):
    """Workflow, idempotency key (a fresh UUID each time the form is shown) and
    a JSON object payload."""

    workflow = forms.ChoiceField(choices=_workflow_choices)
    idempotency_key = forms.CharField(
        max_length=255, initial=_fresh_key, strip=False,
        help_text="Triggering again with the same key and payload replays the existing task.")
    payload = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 10, "cols": 80, "class": "pilot-code",
                                     "spellcheck": "false"}),
        initial="{}", strip=False, help_text="A JSON object; validated like the API's.")

    def clean_payload(self):
        text = self.cleaned_data["payload"]
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from None

    def add_engine_error(self, error: PilotError) -> None:
        """Show an engine refusal on the field it is about (or the whole form)."""
        if isinstance(error, ValidationFailed) and error.errors:
            for field, problems in error.errors.items():
                self.add_error(field if field in self.fields else None,
                               _flatten(problems, prefix=""))
            return
        field = {UnknownWorkflow: "workflow", IdempotencyKeyInvalid: "idempotency_key",
                 IdempotencyKeyMissing: "idempotency_key",
                 IdempotencyKeyReused: "idempotency_key",
                 PayloadTooLarge: "payload"}.get(type(error))
        self.add_error(field, f"{error.detail} ({error.code})")


def _flatten(problems, *, prefix: str) -> list[str]:
    """DRF's nested {field: [msg]} as flat "field: msg" lines."""
    if isinstance(problems, dict):
        lines = []
        for name, inner in problems.items():
            lines.extend(_flatten(inner, prefix=f"{prefix}{name}: "))
        return lines
    if isinstance(problems, list):
        return [line for item in problems for line in _flatten(item, prefix=prefix)]
    return [f"{prefix}{problems}"]


class ReasonForm(forms.Form):
    """The confirmation of an operator action: why (kept in the audit trail)."""

    reason = forms.CharField(max_length=500, required=False,
                             widget=forms.TextInput(attrs={"size": 60}),
                             help_text="Recorded in each task's history.")
