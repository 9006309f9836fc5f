"""Trigger a workflow by hand: the same engine call as the API, `source=admin`."""

from __future__ import annotations

import json

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from workflows.admin.audit import console_action_log
from workflows.admin.forms import TriggerForm
from workflows.admin.schema import payload_example
from workflows.engine import CREATED, REPLAYED, task_trigger
from workflows.registry import registry
from workflows.rules.errors import PilotError
from workflows.rules.states import Source

TRIGGER_PERMISSION = "workflows.add_task"  # the same permission the API asks for


def _initial(request) -> dict:
    """`?workflow=NAME` (the workflows page's links) chooses the workflow and
    starts the payload from its example."""
    workflow = registry.find(request.GET.get("workflow"))
    if workflow is None:
        return {}
    return {"workflow": workflow.name, "payload": json.dumps(payload_example(workflow),
                                                             indent=2)}


def trigger_view(model_admin, request):
    """GET: the form (a fresh key each time). POST: `task_trigger` as the
    signed-in user; created/restarted/replayed go to the task page with a
    message saying which (and an entry in Django's admin log); a refusal stays
    on the form, said once, on the field it is about."""
    if not request.user.has_perm(TRIGGER_PERMISSION):
        raise PermissionDenied(f"Triggering needs the permission {TRIGGER_PERMISSION}")
    form = TriggerForm(request.POST if request.method == "POST" else None,
                       initial=_initial(request))
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            outcome = task_trigger(owner=request.user, key=data["idempotency_key"],
                                   workflow=data["workflow"], payload=data["payload"],
                                   source=Source.ADMIN, trace_id=getattr(request, "trace_id", ""),
                                   traceparent=getattr(request, "traceparent", ""))
        except PilotError as error:
            form.add_engine_error(error)
        else:
            return _done(request, outcome)
    return TemplateResponse(request, "pilot/admin/trigger.html", {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Trigger a workflow",
        "form": form,
        "examples": {w.name: payload_example(w) for w in registry.all()},
    })


def _done(request, outcome):
    task = outcome.task
    link = reverse("admin:workflows_task_change", args=[task.pk])
    if outcome.outcome == CREATED:
        console_action_log(request.user, [task], "Triggered through the console: created",
                           added=True)
        messages.success(request, format_html(
            "Created task <a href='{}'>{}</a> ({}); it is queued.", link, task.pk,
            task.workflow))
    elif outcome.outcome == REPLAYED:
        console_action_log(request.user, [task], "Triggered through the console: replayed "
                           "(nothing new was started)")
        messages.warning(request, format_html(
            "Replayed: task <a href='{}'>{}</a> already exists for this key and payload "
            "(state {}, {} replay(s) absorbed); nothing new was started.",
            link, task.pk, task.state, task.replays))
    else:
        console_action_log(request.user, [task], "Triggered through the console: restarted "
                           "the failed task from its checkpoints")
        messages.info(request, format_html(
            "Restarted: the failed task <a href='{}'>{}</a> for this key resumes from "
            "its checkpoints.", link, task.pk))
    return HttpResponseRedirect(link)
