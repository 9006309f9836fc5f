"""Confirmation pages for operator actions: a dry run first, then the outcomes.

Two doors, one behaviour:
- bulk actions on the list (`bulk_view`), reached through Django's action
  machinery, which already refuses an action the user lacks the permission for;
- the task page's buttons (`transition_view`, `<id>/transition/<action>/`),
  which refuse a user without the action's permission with 403 on GET and POST.

Both show every selected task with what confirming would do to it (and no
Confirm button when it would change none of them: "Back" only), and on
confirmation call the engine once per task (its own transaction), reporting
each task's outcome and writing Django admin log entries for the tasks it
changed. CSRF applies to every POST (admin views are protected).

"Select all N tasks" on the list (Django's select-across), or more than
MAX_BULK selected, goes to the filter-wide action instead (bulk.py): a summary
dry run, then chunks with a progress page.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from workflows.admin.actions import ACTIONS, OperatorAction, actions_apply, actions_plan
from workflows.admin.audit import action_message, console_action_log
from workflows.admin.forms import ReasonForm
from workflows.models import Task

# The dry run lists every task; beyond this, select fewer (or filter) first.
MAX_BULK = 500
CONFIRM_FIELD = "confirmed"


def _context(model_admin, request, **extra) -> dict:
    return {**model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
            **extra}


def bulk_view(model_admin, request, queryset, action: OperatorAction):
    """The admin action for `action`: confirmation page, then per-task outcomes.
    The list's filters (the action POST's query string) are kept for "Back"."""
    back_url = reverse("admin:workflows_task_changelist")
    if request.GET:
        back_url += "?" + request.GET.urlencode()
    filter_wide = reverse("admin:workflows_task_bulk", args=[action.name])
    filter_wide += f"?{request.GET.urlencode()}"
    if request.POST.get("select_across") == "1":
        return HttpResponseRedirect(filter_wide)
    tasks = list(queryset.select_related("owner").order_by("-created_at")[:MAX_BULK + 1])
    if len(tasks) > MAX_BULK:  # only a hand-made POST selects that many, one by one
        model_admin.message_user(request, f"Select at most {MAX_BULK} tasks one by one; for "
                                 "more, use “Select all” or “… all matching”, which act on "
                                 "the whole filter in chunks.", messages.ERROR)
        return None
    form = ReasonForm(request.POST if request.POST.get(CONFIRM_FIELD) == "yes" else None)
    if form.is_bound and form.is_valid():
        reason = form.cleaned_data["reason"]
        results = actions_apply(action, tasks, user=request.user, reason=reason)
        console_action_log(request.user, [r.task for r in results if r.ok],
                           action_message(action.label, reason, scope="selected tasks"))
        return TemplateResponse(request, "pilot/admin/action_outcomes.html", _context(
            model_admin, request, title=f"{action.label}: outcomes", action=action,
            results=_fresh_states(results), changed=sum(r.ok for r in results),
            back_url=back_url))
    plan = actions_plan(action, tasks)
    return TemplateResponse(request, "pilot/admin/action_confirm.html", _context(
        model_admin, request, title=f"{action.label}: confirm", action=action, form=form,
        plan=plan, changing=sum(c.changes for c in plan), bulk=True, confirm_field=CONFIRM_FIELD,
        checkbox_name=helpers.ACTION_CHECKBOX_NAME, form_action="", cancel_url=back_url))


def transition_view(model_admin, request, object_id, action_name):
    """One task, one action: GET shows the dry run, POST applies it and returns
    to the task page with the outcome as a message."""
    action = ACTIONS.get(action_name)
    if action is None:
        raise Http404("No such action")
    if not (action.permitted(request.user) and model_admin.has_view_permission(request)):
        raise PermissionDenied(f"{action.label} needs the permission {action.permission} "
                               "(and workflows.view_task)")
    task = model_admin.get_object(request, object_id)
    if task is None:
        raise Http404("No such task")
    task_url = reverse("admin:workflows_task_change", args=[task.pk])
    # A retry from a chosen step (the task page's form): ?from_step=, then the POST's field.
    from_step = (request.POST if request.method == "POST" else request.GET).get("from_step")
    if action.transition != "retry" or action.from_start or not from_step:
        from_step = None
    label = f"{action.label} from step {from_step}" if from_step else action.label
    form = ReasonForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        reason = form.cleaned_data["reason"]
        [result] = actions_apply(action, [task], user=request.user, reason=reason,
                                 from_step=from_step)
        if result.ok:
            console_action_log(request.user, [result.task], action_message(label, reason))
            messages.success(request, f"{label}: {result.detail}.")
        else:
            messages.error(request, f"{label} refused — {result.detail}")
        return HttpResponseRedirect(task_url)
    plan = actions_plan(action, [task], from_step=from_step)
    return TemplateResponse(request, "pilot/admin/action_confirm.html", _context(
        model_admin, request, title=f"{label}: confirm", action=action, label=label,
        form=form, plan=plan, changing=sum(c.changes for c in plan), bulk=False,
        original=task, from_step=from_step, confirm_field=CONFIRM_FIELD,
        form_action=request.path, cancel_url=task_url))


def _fresh_states(results) -> list:
    """`results`, each with `.now`: the task's state read again after all of
    them were applied (a cancelled running task moves on to cancelled within
    seconds), so the outcome page's links say where each task is now."""
    now = dict(Task.objects.filter(pk__in=[r.task_id for r in results])
               .values_list("pk", "state"))
    for result in results:
        result.now = now.get(result.task_id, "deleted")
    return results
