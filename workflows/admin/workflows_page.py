"""Every registered workflow: steps, policies, payload fields; the state diagram."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from workflows.admin.diagram import state_diagram
from workflows.registry import registry


def _payload_fields(workflow) -> list[dict]:
    """Name, type and whether required, from the workflow's DRF serializer."""
    if workflow.payload_serializer is None:
        return []
    return [{"name": name, "type": type(field).__name__.removesuffix("Field"),
             "required": field.required}
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
