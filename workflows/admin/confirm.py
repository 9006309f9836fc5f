"""Confirmation pages for operator actions: a dry run first, then the outcomes.

Two doors, one behaviour:
- bulk actions on the list (`bulk_view`), reached through Django's action
  machinery, which already refuses an action the user lacks the permission for;
- the task page's buttons (`transition_view`, `<id>/transition/<action>/`),
  which refuse a user without the action's permission with 403 on GET and POST.

Both show every selected task with what confirming would do to it, and on
confirmation call the engine once per task (its own transaction), reporting
each task's outcome. CSRF applies to every POST (admin views are protected).
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from workflows.admin.actions import ACTIONS, OperatorAction, actions_apply, actions_plan
from workflows.admin.forms import ReasonForm

# The dry run lists every task; beyond this, select fewer (or filter) first.
MAX_BULK = 500
CONFIRM_FIELD = "confirmed"


def _context(model_admin, request, **extra) -> dict:
    return {**model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
            **extra}


def bulk_view(model_admin, request, queryset, action: OperatorAction):
    """The admin action for `action`: confirmation page, then per-task outcomes."""
    tasks = list(queryset.select_related("owner").order_by("-created_at")[:MAX_BULK + 1])
    if len(tasks) > MAX_BULK:
        model_admin.message_user(request, f"Select at most {MAX_BULK} tasks for one action.",
                                 messages.ERROR)
        return None
    form = ReasonForm(request.POST if request.POST.get(CONFIRM_FIELD) == "yes" else None)
    if form.is_bound and form.is_valid():
        results = actions_apply(action, tasks, user=request.user,
                                reason=form.cleaned_data["reason"])
        return TemplateResponse(request, "pilot/admin/action_outcomes.html", _context(
            model_admin, request, title=f"{action.label}: outcomes", action=action,
            results=results, changed=sum(r.ok for r in results),
            back_url=reverse("admin:workflows_task_changelist")))
    return TemplateResponse(request, "pilot/admin/action_confirm.html", _context(
        model_admin, request, title=f"{action.label}: confirm", action=action, form=form,
        plan=actions_plan(action, tasks), bulk=True, confirm_field=CONFIRM_FIELD,
        checkbox_name=helpers.ACTION_CHECKBOX_NAME, form_action="",
        cancel_url=reverse("admin:workflows_task_changelist")))


def transition_view(model_admin, request, object_id, action_name):
    """One task, one action: GET shows the dry run, POST applies it and returns
    to the task page with the outcome as a message."""
    action = ACTIONS.get(action_name)
    if action is None:
        raise Http404("No such action")
    if not (action.permitted(request.user) and model_admin.has_view_permission(request)):
        raise PermissionDenied(f"{action.label} needs {action.permission} and "
                               "workflows.view_task")
    task = model_admin.get_object(request, object_id)
    if task is None:
        raise Http404("No such task")
    task_url = reverse("admin:workflows_task_change", args=[task.pk])
    form = ReasonForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        [result] = actions_apply(action, [task], user=request.user,
                                 reason=form.cleaned_data["reason"])
        if result.ok:
            messages.success(request, f"{action.label}: {result.detail}.")
        else:
            messages.error(request, f"{action.label} refused — {result.detail}")
        return HttpResponseRedirect(task_url)
    return TemplateResponse(request, "pilot/admin/action_confirm.html", _context(
        model_admin, request, title=f"{action.label}: confirm", action=action, form=form,
        plan=actions_plan(action, [task]), bulk=False, original=task,
        confirm_field=CONFIRM_FIELD, form_action=request.path, cancel_url=task_url))
