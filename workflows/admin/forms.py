"""Forms of the operator console. They parse and shape input only; the engine
validates payloads (with the workflow's own serializer, exactly as the API
does) and decides.

Whatever is typed into the payload box ends as a form error, never a 500:
malformed JSON, a number with more digits than Python will convert (4 300),
nesting deeper than the parser follows, or text that is not valid Unicode (an
unpaired surrogate such as "\\ud800", which no database can store).
"""

from __future__ import annotations

import json
import re
import uuid

from django import forms
from django.forms.fields import InvalidJSONInput
from django.urls import reverse
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from workflows.registry import registry
from workflows.rules.errors import (
    IdempotencyKeyInvalid,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    PayloadTooLarge,
    PilotError,
    TaskCancelled,
    UnknownWorkflow,
    ValidationFailed,
)

_SURROGATE = re.compile("[\ud800-\udfff]")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def _workflow_choices():
    return [(name, name) for name in registry.names()]


def _fresh_key() -> str:
    return str(uuid.uuid4())


def _has_surrogate(value) -> bool:
    """Whether any string (key or value) in the JSON `value` holds an unpaired
    surrogate; iterative, so a deep value cannot exhaust the stack."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


# How deep a payload may nest. json.loads alone is no limit: Python 3.11 raises
# RecursionError near 1 000 levels, Python 3.13 parses 3 000 and more; a value that
# deep could still fail later (json.dumps, Django's JSONField). The same answer on
# every Python, well above any real payload.
MAX_PAYLOAD_DEPTH = 500


def _too_deep(value) -> bool:
    """Whether the JSON `value` nests deeper than MAX_PAYLOAD_DEPTH; iterative."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_PAYLOAD_DEPTH:
            return True
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return False


def parse_payload(text: str):
    """The JSON value of `text`, or a ValidationError that says what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(
            f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise forms.ValidationError("Not readable: the JSON is nested too deeply.") from None
    except ValueError as exc:
        # int('9' * 5000): Python converts at most 4 300 digits (sys.int_info).
        problem = ("a number has too many digits" if "digits" in str(exc)
                   else str(exc)[:200])
        raise forms.ValidationError(f"Not valid JSON: {problem}.") from None
    if _too_deep(value):
        raise forms.ValidationError("Not readable: the JSON is nested too deeply.")
    if _has_surrogate(value):
        raise forms.ValidationError(
            "Not valid text: a string contains an unpaired surrogate (\\ud800–\\udfff), "
            "which is not Unicode and cannot be stored.")
    return value


class PayloadField(forms.JSONField):
    """A JSON box that reads its text with `parse_payload`: a number of 5 000
    digits, nesting deeper than the parser follows or an unpaired surrogate is
    a form error, and the box shows back what was typed — never a value the
    page could not encode."""

    def to_python(self, value):
        if self.disabled or not isinstance(value, str):
            return super().to_python(value)
        if value.strip() == "":
            return None
        return parse_payload(value)

    def bound_data(self, data, initial):
        if self.disabled or data is None:
            return super().bound_data(data, initial)
        try:
            return parse_payload(data)
        except forms.ValidationError:
            return InvalidJSONInput(_SURROGATE.sub("\ufffd", data))


class TriggerForm(forms.Form):
    """Workflow, idempotency key (a fresh UUID each time the form is shown) and
    a JSON object payload."""

    workflow = forms.ChoiceField(choices=_workflow_choices)
    # No length or pattern here: the engine applies the key rule (workflows.rules.keys),
    # so a key is refused with the same words here as through the API.
    idempotency_key = forms.CharField(
        initial=_fresh_key, strip=False,
        help_text="Triggering again with the same key and payload replays the existing task.")
    payload = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 10, "cols": 80, "class": "pilot-code",
                                     "spellcheck": "false"}),
        initial="{}", strip=False,
        help_text="A JSON object; validated like the API's. Choosing a workflow fills in "
                  "its fields.")

    def clean_payload(self):
        return parse_payload(self.cleaned_data["payload"])

    def add_engine_error(self, error: PilotError) -> None:
        """Show an engine refusal once, on the field it is about (or the whole
        form); task ids in it link to the task page."""
        if isinstance(error, ValidationFailed) and error.errors:
            for field, problems in error.errors.items():
                self.add_error(field if field in self.fields else None,
                               _flatten(problems, prefix=""))
            return
        field = {UnknownWorkflow: "workflow", IdempotencyKeyInvalid: "idempotency_key",
                 IdempotencyKeyMissing: "idempotency_key",
                 IdempotencyKeyReused: "idempotency_key", TaskCancelled: "idempotency_key",
                 PayloadTooLarge: "payload"}.get(type(error))
        self.add_error(field, forms.ValidationError(_linked(f"{error.detail} ({error.code})")))


def _linked(text: str):
    """`text`, escaped, with each task id in it a link to that task's page."""
    pieces, last = [], 0
    for match in _UUID.finditer(text):
        url = reverse("admin:workflows_task_change", args=[match.group()])
        pieces += [escape(text[last:match.start()]),
                   format_html('<a href="{}">{}</a>', url, match.group())]
        last = match.end()
    if not pieces:
        return text
    return mark_safe("".join([*pieces, escape(text[last:])]))  # noqa: S308 - escaped above


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


class SignalForm(forms.Form):
    """A signal to a waiting task: its name, a JSON object payload, and the
    signal's idempotency key — fresh when the form is first shown and carried
    through the confirmation, so a double submit sends one signal."""

    name = forms.CharField(max_length=100, strip=False,
                           help_text="The signal the task's wait step waits for.")
    payload = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60, "class": "pilot-code",
                                     "spellcheck": "false"}),
        initial="{}", strip=False, help_text="A JSON object: the wait step's output.")
    key = forms.CharField(widget=forms.HiddenInput, initial=_fresh_key, strip=False)

    def clean_payload(self):
        payload = parse_payload(self.cleaned_data["payload"])
        if not isinstance(payload, dict):
            raise forms.ValidationError("The payload must be a JSON object.")
        return payload

    def add_engine_error(self, error: PilotError) -> None:
        field = {ValidationFailed: "name", PayloadTooLarge: "payload"}.get(type(error))
        if isinstance(error, ValidationFailed) and error.errors and "name" not in error.errors:
            field = "payload"
        self.add_error(field, forms.ValidationError(f"{error.detail} ({error.code})"))


class ReasonForm(forms.Form):
    """The confirmation of an operator action: why (kept in the audit trail)."""

    reason = forms.CharField(max_length=500, required=False,
                             widget=forms.TextInput(attrs={"size": 60}),
                             help_text="Recorded in each task's history.")
