"""Approvals in the console (docs/console.md, "Waiting for a person"): a signal
to a waiting task, sent by an operator through a confirmation page.

`<id>/signal/` — GET: the form (the awaited signal's name; `?preset=approve`
or `reject` fills the payload with `{"approved": true|false, "by": <you>}`);
POST: the confirmation page, nothing sent yet; POST with `confirmed=yes`: the
engine's `task_signal` as the operator (`user:<name>` in the audit trail), a
LogEntry, back to the task page with the outcome. The form's key is fresh
when it is first shown and carried through, so a second submit is a replay.
Needs `workflows.signal_task` (403 without, on GET and POST)."""

from __future__ import annotations

import json

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from workflows.admin.audit import console_action_log
from workflows.admin.forms import SignalForm
from workflows.engine import task_signal
from workflows.rules.errors import PilotError

SIGNAL_PERMISSION = "workflows.signal_task"
PRESETS = {"approve": True, "reject": False}


def can_signal(user) -> bool:
    return user.has_perm(SIGNAL_PERMISSION)


def signal_view(model_admin, request, object_id):
    if not (can_signal(request.user) and model_admin.has_view_permission(request)):
        raise PermissionDenied(f"Sending a signal needs the permission {SIGNAL_PERMISSION} "
                               "(and workflows.view_task)")
    task = model_admin.get_object(request, object_id)
    if task is None:
        raise Http404("No such task")
    task_url = reverse("admin:workflows_task_change", args=[task.pk])
    awaited = (task.waits_for or {}).get("name") or ""
    if request.method != "POST":
        form = SignalForm(initial=_initial(request, awaited))
        return _page(model_admin, request, task, form, task_url, confirm=False)
    form = SignalForm(request.POST)
    if not form.is_valid():
        return _page(model_admin, request, task, form, task_url, confirm=False)
    if request.POST.get("confirmed") != "yes":
        return _page(model_admin, request, task, form, task_url, confirm=True)
    data = form.cleaned_data
    try:
        outcome = task_signal(task_id=task.pk, name=data["name"], payload=data["payload"],
                              key=data["key"], user=request.user)
    except PilotError as error:
        form.add_engine_error(error)
        return _page(model_admin, request, task, form, task_url, confirm=False)
    if outcome.replayed:
        messages.info(request, f"Signal {data['name']!r} was already sent with this form; "
                               "nothing new was sent.")
    else:
        console_action_log(request.user, [outcome.task],
                           f"Sent signal {data['name']!r} through the console: "
                           f"{json.dumps(data['payload'], sort_keys=True)}")
        woke = " The task was waiting for it and is woken." if outcome.woke else (
            " The task does not wait for it now: it is kept for a later wait.")
        messages.success(request, f"Signal {data['name']!r} sent.{woke}")
    return HttpResponseRedirect(task_url)


def _initial(request, awaited: str) -> dict:
    name = request.GET.get("name") or awaited
    preset = PRESETS.get(request.GET.get("preset", ""))
    payload = {} if preset is None else {"approved": preset, "by": request.user.get_username()}
    return {"name": name, "payload": json.dumps(payload, indent=2)}


def _page(model_admin, request, task, form, task_url, *, confirm: bool):
    payload = form.cleaned_data.get("payload") if confirm else None
    return TemplateResponse(request, "pilot/admin/signal.html", {
        **model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
        "title": "Send a signal: confirm" if confirm else "Send a signal",
        "original": task, "task": task, "form": form, "confirm": confirm,
        "payload_text": json.dumps(payload, indent=2, sort_keys=True) if confirm else "",
        "awaited": task.waits_for, "cancel_url": task_url})
