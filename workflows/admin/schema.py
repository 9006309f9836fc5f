"""A workflow's payload fields, read from its DRF serializer: their JSON types
for the workflows page, and an example payload the trigger form starts from."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.fields import empty

# DRF field classes (and subclasses such as workflows.rules.fields.JSONInteger) by the
# JSON type a client must send, with the example value of that type.
_JSON_TYPES = [
    (serializers.BooleanField, "boolean", False), (serializers.IntegerField, "integer", 1),
    (serializers.FloatField, "number", 1.0), (serializers.DecimalField, "number", 1.0),
    (serializers.ChoiceField, "string", ""), (serializers.CharField, "string", ""),
    (serializers.ListField, "array", []), (serializers.DictField, "object", {}),
    (serializers.BaseSerializer, "object", {}),
]


def _json_type(field) -> tuple[str, object]:
    return next(((name, example) for cls, name, example in _JSON_TYPES
                 if isinstance(field, cls)),
                (type(field).__name__.removesuffix("Field"), None))


def _example(field):
    """The field's default, else the smallest value it accepts, else a value of its type."""
    if field.default is not empty and not callable(field.default):
        return field.default
    if isinstance(field, serializers.ChoiceField) and field.choices:
        return next(iter(field.choices))
    minimum = getattr(field, "min_value", None)
    if minimum is not None:
        return minimum
    return _json_type(field)[1]


def payload_fields(workflow) -> list[dict]:
    """Name, JSON type and whether required, from the workflow's serializer."""
    if workflow.payload_serializer is None:
        return []
    return [{"name": name, "type": _json_type(field)[0], "required": field.required}
            for name, field in workflow.payload_serializer().fields.items()]


def payload_example(workflow) -> dict:
    """A payload to start from: every required field, and every optional one
    with a default, at its default or smallest accepted value. `{}` when the
    workflow takes any JSON object."""
    if workflow.payload_serializer is None:
        return {}
    example = {}
    for name, field in workflow.payload_serializer().fields.items():
        if field.read_only:
            continue
        if field.required or field.default is not empty:
            example[name] = _example(field)
    return example
