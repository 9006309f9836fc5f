"""Every registered workflow: steps, policies, payload fields; the state diagram."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from rest_framework import serializers

from workflows.admin.diagram import state_diagram
from workflows.registry import registry

# DRF field classes (and subclasses such as workflows.fields.JSONInteger) by the
# JSON type a client must send.
_JSON_TYPES = [
    (serializers.BooleanField, "boolean"), (serializers.IntegerField, "integer"),
    (serializers.FloatField, "number"), (serializers.DecimalField, "number"),
    (serializers.CharField, "string"), (serializers.ListField, "array"),
    (serializers.DictField, "object"), (serializers.BaseSerializer, "object"),
]


def _json_type(field) -> str:
    return next((name for cls, name in _JSON_TYPES if isinstance(field, cls)),
                type(field).__name__.removesuffix("Field"))


def _payload_fields(workflow) -> list[dict]:
    """Name, JSON type and whether required, from the workflow's DRF serializer."""
    if workflow.payload_serializer is None:
        return []
    return [{"name": name, "type": _json_type(field), "required": field.required}
            for name, field in workflow.payload_serializer().fields.items()]


def workflows_view(model_admin, request):
    if not model_admin.has_view_permission(request):
        raise PermissionDenied("The workflows page needs workflows.view_task")
    workflows = []
    for workflow in registry.all():
        described = workflow.describe()
        described["payload_fields"] = _payload_fields(workflow)
        described["plan_note"] = ("runs a prefix of these steps chosen by its payload"
                                  if workflow.plan else "")
        workflows.append(described)
    return TemplateResponse(request, "pilot/admin/workflows.html", {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Workflows",
        "workflows": workflows,
        "diagram": state_diagram(),
    })
