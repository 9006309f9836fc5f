"""Trigger a workflow by hand: the same engine call as the API, `source=admin`."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from workflows.admin.forms import TriggerForm
from workflows.engine.triggers import CREATED, REPLAYED, task_trigger
from workflows.errors import PilotError, TaskCancelled
from workflows.states import Source

TRIGGER_PERMISSION = "workflows.add_task"  # the same permission the API asks for


def trigger_view(model_admin, request):
    """GET: the form (a fresh key each time). POST: `task_trigger` as the
    signed-in user; created/restarted/replayed go to the task page with a
    message saying which; a refusal stays on the form with the reason."""
    if not request.user.has_perm(TRIGGER_PERMISSION):
        raise PermissionDenied(f"Triggering needs {TRIGGER_PERMISSION}")
    form = TriggerForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            outcome = task_trigger(owner=request.user, key=data["idempotency_key"],
                                   workflow=data["workflow"], payload=data["payload"],
                                   source=Source.ADMIN)
        except PilotError as error:
            form.add_engine_error(error)
            level = messages.WARNING if isinstance(error, TaskCancelled) else messages.ERROR
            messages.add_message(request, level,
                                 f"Not triggered — {error.title}: {error.detail} ({error.code})")
        else:
            task = outcome.task
            link = reverse("admin:workflows_task_change", args=[task.pk])
            if outcome.outcome == CREATED:
                messages.success(request, format_html(
                    "Created task <a href='{}'>{}</a> ({}); it is queued.", link, task.pk,
                    task.workflow))
            elif outcome.outcome == REPLAYED:
                messages.warning(request, format_html(
                    "Replayed: task <a href='{}'>{}</a> already exists for this key and payload "
                    "(state {}, {} replay(s) absorbed); nothing new was started.",
                    link, task.pk, task.state, task.replays))
            else:
                messages.info(request, format_html(
                    "Restarted: the failed task <a href='{}'>{}</a> for this key resumes from "
                    "its checkpoints.", link, task.pk))
            return HttpResponseRedirect(link)
    return TemplateResponse(request, "pilot/admin/trigger.html", {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Trigger a workflow",
        "form": form,
    })
