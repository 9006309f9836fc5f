"""A schedule's own page in the console, beside its form (docs/schedules.md,
"In the console"): what it will do next and buttons to drive it.

- `schedule_page_context(schedule, user)`: its next NEXT_SLOTS slots (ISO,
  UTC), a link to its runs (the task list searched by its key prefix
  `schedule:<name>:` and filtered to its owner — the slots' and the run-now
  keys both start so) and, when its workflow waits for a signal, to those of
  its runs waiting for one;
- `run_now_view` (`<id>/run-now/`): GET a confirmation naming what will run,
  as whom and under which key; POST the engine's `schedule_run_now` (the
  normal trigger path, a key of its own), logged in Django's admin log on
  the schedule and on the task, then the task page;
- `set_enabled_view` (`<id>/enabled/`, POST only): pause or resume, the same
  engine call as the list's actions, logged on the schedule.

Both need the schedule's change permission (which a schedule running as a
client withholds from operators without workflows.schedule_as_owner); Run now
also the trigger permission.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from workflows.admin.audit import action_message, console_action_log
from workflows.admin.forms import ReasonForm
from workflows.admin.trigger import TRIGGER_PERMISSION
from workflows.engine import (
    CREATED,
    schedule_run_now,
    schedule_run_now_key,
    schedule_set_enabled,
)
from workflows.models import PilotSchedule
from workflows.registry import registry
from workflows.rules.cron import CronInvalid, cron_next
from workflows.rules.errors import PilotError

NEXT_SLOTS = 5


def next_slots(schedule: PilotSchedule, n: int = NEXT_SLOTS) -> list[datetime]:
    """The next `n` slots it will fire: none while paused (or paused by an
    error: no next slot)."""
    if not schedule.enabled or schedule.next_slot_at is None:
        return []
    slots = [schedule.next_slot_at]
    try:
        while len(slots) < n:
            slots.append(cron_next(schedule.cron, slots[-1], hash_id=schedule.name))
    except (CronInvalid, ValueError, KeyError, TypeError):  # a stored cron croniter refuses
        pass
    return slots


def runs_url(schedule: PilotSchedule, **extra: str) -> str:
    query = {"q": f"schedule:{schedule.name}:", "owner": str(schedule.owner_id), **extra}
    return f"{reverse('admin:workflows_task_changelist')}?{urlencode(query)}"


def waits_for_signal(workflow_name: str) -> bool:
    workflow = registry.find(workflow_name)
    return workflow is not None and any(
        step.wait is not None and step.wait.kind == "signal" for step in workflow.steps)


def schedule_page_context(schedule: PilotSchedule) -> dict:
    return {
        "next_slots": next_slots(schedule),
        "runs_url": runs_url(schedule),
        "waiting_url": (runs_url(schedule, waiting_for="signal")
                        if waits_for_signal(schedule.workflow) else ""),
        "run_now_url": reverse("admin:workflows_pilotschedule_run_now", args=[schedule.pk]),
        "enabled_url": reverse("admin:workflows_pilotschedule_enabled", args=[schedule.pk]),
    }


def _schedule_for(model_admin, request, object_id, *, trigger: bool) -> PilotSchedule:
    schedule = model_admin.get_object(request, object_id)
    if schedule is None:
        raise Http404("No such schedule")
    if not model_admin.has_change_permission(request, schedule):
        raise PermissionDenied("Driving this schedule needs the permission to change it "
                               "(workflows.change_pilotschedule; for one that runs as a client, "
                               "workflows.schedule_as_owner too)")
    if trigger and not request.user.has_perm(TRIGGER_PERMISSION):
        raise PermissionDenied(f"Run now needs the permission {TRIGGER_PERMISSION}")
    return schedule


def _log_on_schedule(user, schedule: PilotSchedule, message: str) -> None:
    LogEntry.objects.log_actions(user_id=user.pk, queryset=[schedule], action_flag=CHANGE,
                                 change_message=message[:2000])


def run_now_view(model_admin, request, object_id):
    schedule = _schedule_for(model_admin, request, object_id, trigger=True)
    change_url = reverse("admin:workflows_pilotschedule_change", args=[schedule.pk])
    # The token is chosen when the page is shown: the same confirmation sent
    # twice replays its task.
    token = request.POST.get("token", "") if request.method == "POST" else uuid.uuid4().hex
    form = ReasonForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        reason = form.cleaned_data["reason"]
        try:
            outcome = schedule_run_now(name=schedule.name, token=token, actor=request.user,
                                       trace_id=getattr(request, "trace_id", ""))
        except PilotError as exc:
            messages.error(request, f"Run now refused — {exc.code}: {exc.detail}")
            return HttpResponseRedirect(change_url)
        task = outcome.task
        created = outcome.outcome == CREATED
        what = (f"Run now through the console: task {task.pk} "
                f"({'created' if created else outcome.outcome})")
        _log_on_schedule(request.user, schedule, action_message(what, reason))
        console_action_log(request.user, [task], action_message(
            f"Run now of schedule {schedule.name}", reason), added=created)
        link = reverse("admin:workflows_task_change", args=[task.pk])
        messages.success(request, format_html(
            "Schedule {} ran now: task <a href='{}'>{}</a> ({}).", schedule.name, link,
            task.pk, "created, queued" if created else f"{outcome.outcome}, nothing new started"))
        return HttpResponseRedirect(link)
    return TemplateResponse(request, "pilot/admin/schedule_run_now.html", {
        **model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
        "title": f"Run schedule {schedule.name} now?", "schedule": schedule, "form": form,
        "payload_json": json.dumps(schedule.payload, indent=2, ensure_ascii=False),
        "token": token, "key": schedule_run_now_key(schedule.name, token),
        "cancel_url": change_url})


def set_enabled_view(model_admin, request, object_id):
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    schedule = _schedule_for(model_admin, request, object_id, trigger=False)
    enabled = request.POST.get("enabled") == "on"
    saved = schedule_set_enabled(name=schedule.name, enabled=enabled)
    word = "Resumed" if enabled else "Paused"
    _log_on_schedule(request.user, saved, f"{word} through the console")
    messages.success(request, f"{word} schedule {saved.name}" + (
        " (from its next slot)." if enabled else "."))
    return HttpResponseRedirect(reverse("admin:workflows_pilotschedule_change",
                                        args=[saved.pk]))

