"""Schedules in the operator console: list, add, change, pause/resume, delete.

Like the rest of the console it never writes a model itself: the form's values
go to workflows.engine.schedule_definitions (`schedule_save`,
`schedule_set_enabled`, `schedule_delete`), which validate, lock and write.
A schedule declared in code shows read-only, except its `enabled` switch.

Who a schedule runs as is a permission (issue 31, N3): its runs are its
owner's own tasks — in that client's API list, their webhooks signed with that
client's secret. Without `workflows.schedule_as_owner` an operator's
schedules run as the scheduler user (the owner field is not theirs to set),
and a schedule that runs as anybody else is read-only to them (no change, no
pause or resume). Superusers and inactive users are never owners
(accounts.schedule_owner_problem). Every add and change is in Django's admin
log, naming who the schedule runs as and who saved it.
Its page drives it too (workflows.admin.schedule_pages): Run now, pause or
resume, its next slots, its runs. The add form chooses no workflow for the
operator and fills the payload with the chosen workflow's example, like the
Trigger form; the owner is chosen by name.
Registered on the admin site by WorkflowsConfig.ready().
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.urls import path, reverse
from django.utils.html import format_html

from workflows.accounts import SCHEDULER_OWNER, scheduler_owner_get, user_by_name_filter
from workflows.admin.forms import PayloadField
from workflows.admin.guard import GuardedChangelist
from workflows.admin.schedule_pages import (
    next_slots,
    run_now_view,
    runs_url,
    schedule_page_context,
    set_enabled_view,
)
from workflows.admin.schema import payload_example
from workflows.admin.text import timestamp, timestamp_field
from workflows.engine import (
    schedule_delete,
    schedule_save,
    schedule_set_enabled,
    schedule_validate,
)
from workflows.models import PilotSchedule, ScheduleOrigin
from workflows.registry import registry
from workflows.rules.errors import ValidationFailed

_FIELDS = ("name", "workflow", "cron", "payload", "missed", "owner", "enabled")
OWNER_PERMISSION = "workflows.schedule_as_owner"


def may_choose_owner(user) -> bool:
    return user.has_perm(OWNER_PERMISSION)


def runs_as_scheduler(schedule) -> bool:
    """Whether a saved schedule runs as the scheduler user (a new one: decided by
    its form)."""
    return schedule.pk is None or schedule.owner_id is None or \
        schedule.owner.get_username() == SCHEDULER_OWNER
# Times as ISO 8601 UTC, like the rest of the console (timestamp_field below).
_STATUS = ("origin", "next_slot", "last_fired_slot_at", "last_fired", "last_task",
           "fired_count", "last_error", "last_error_time", "created", "updated")


class ScheduleForm(forms.ModelForm):
    workflow = forms.ChoiceField(choices=())
    payload = PayloadField(initial=dict, required=False,
                              widget=forms.Textarea(attrs={"rows": 6, "cols": 80}),
                              help_text="The JSON object every run gets.")

    class Meta:
        model = PilotSchedule
        fields = list(_FIELDS)
        help_texts = {
            "name": "Part of every key it fires: schedule:&lt;name&gt;:&lt;slot&gt;.",
            "cron": "5 fields (minute hour day month weekday) or 6 with seconds first, in "
                    "UTC. 0 3 * * * = 03:00 UTC daily; */5 * * * * * = every 5 seconds.",
            "missed": "What runs for slots that passed while no scheduler ran.",
            "owner": f"The user the runs belong to; empty: the {SCHEDULER_OWNER} user.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "workflow" in self.fields:
            current = self.instance.workflow if self.instance.pk else None
            names = registry.names()
            if current and current not in names:  # unregistered since: still shown
                names = [current, *names]
            # No workflow chosen for the operator (the first name was demo.crash).
            blank = [] if current else [("", "— choose a workflow —")]
            self.fields["workflow"].choices = blank + [(n, n) for n in names]
        if "owner" in self.fields:
            owner = self.fields["owner"]
            owner.required = False
            # A select by name, not a raw id box. Every user: the engine says why
            # a superuser or an inactive one is refused (accounts.schedule_owner_problem).
            owner.queryset = get_user_model().objects.order_by(get_user_model().USERNAME_FIELD)
            owner.label_from_instance = lambda user: user.get_username()
            owner.empty_label = f"— the {SCHEDULER_OWNER} user —"

    def clean(self):
        data = super().clean()
        if self.instance.pk and self.instance.declared_in_code:
            return data
        if "owner" not in self.fields:  # not this operator's to choose
            data["owner"] = self.instance.owner if self.instance.pk else scheduler_owner_get()
        elif not data.get("owner"):
            data["owner"] = scheduler_owner_get()
        try:
            data["cron"] = schedule_validate(
                name=data.get("name", self.instance.name), workflow=data.get("workflow"),
                cron=data.get("cron"), payload=data.get("payload") or {},
                owner=data.get("owner"), missed=data.get("missed"))
        except ValidationFailed as exc:
            raise ValidationError({field: messages_ for field, messages_ in exc.errors.items()
                                   if field in self.fields} or exc.detail) from None
        return data


@admin.register(PilotSchedule)
class PilotScheduleAdmin(GuardedChangelist, admin.ModelAdmin):
    form = ScheduleForm
    list_display = ("name", "workflow", "cron", "missed", "enabled", "origin", "next_slot",
                    "last_fired_slot_at", "fired_count", "health", "runs")
    list_filter = ("enabled", "missed", "origin", "workflow")
    search_fields = ("name", "workflow")
    actions = ("enable_selected", "disable_selected")
    change_form_template = "admin/workflows/pilotschedule/change_form.html"

    next_slot = timestamp_field("next_slot_at", "next slot (UTC)")
    last_fired_slot_at = timestamp_field("last_fired_slot", "last fired slot (UTC)")
    last_fired = timestamp_field("last_fired_at", "last fired at (UTC)")
    last_error_time = timestamp_field("last_error_at", "last error at (UTC)")
    created = timestamp_field("created_at", "created (UTC)")
    updated = timestamp_field("updated_at", "updated (UTC)")

    def get_urls(self):
        def view(function):
            return self.admin_site.admin_view(
                lambda request, object_id: function(self, request, object_id))
        return [
            path("<path:object_id>/run-now/", view(run_now_view),
                 name="workflows_pilotschedule_run_now"),
            path("<path:object_id>/enabled/", view(set_enabled_view),
                 name="workflows_pilotschedule_enabled"),
            *super().get_urls(),
        ]

    def render_change_form(self, request, context, add=False, change=False, form_url="",
                           obj=None):
        context = {**context,
                   "payload_examples": {w.name: payload_example(w) for w in registry.all()}}
        if obj is not None:
            context = {**context, **schedule_page_context(obj),
                       "may_drive": self.has_change_permission(request, obj),
                       "next_slots_text": [timestamp(slot, ms=False)
                                           for slot in next_slots(obj)]}
        return super().render_change_form(request, context, add=add, change=change,
                                          form_url=form_url, obj=obj)

    def get_fields(self, request, obj=None):
        return list(_FIELDS) + (list(_STATUS) if obj else [])

    def get_readonly_fields(self, request, obj=None):
        owner = () if may_choose_owner(request.user) else ("owner",)
        if obj is None:
            return owner
        if obj.declared_in_code:
            return tuple(f for f in _FIELDS if f != "enabled") + _STATUS
        return ("name", *owner, *_STATUS)  # a new name is a new schedule (and new keys)

    def has_change_permission(self, request, obj=None):
        # Changing (or pausing, resuming) a schedule that runs as a client acts as it.
        if obj is not None and not runs_as_scheduler(obj) and not may_choose_owner(request.user):
            return False
        return super().has_change_permission(request, obj)

    def construct_change_message(self, request, form, formsets, add=False):
        owner = form.cleaned_data.get("owner") or form.instance.owner
        what = "Added" if add else f"Changed {', '.join(form.changed_data) or 'nothing'}"
        return f"{what}; runs as {owner.get_username()} (saved by {request.user.get_username()})"

    @admin.display(description="last task")
    def last_task(self, obj):
        if not obj.last_task_id:
            return "-"
        url = reverse("admin:workflows_task_change", args=[obj.last_task_id])
        return format_html('<a href="{}">{}</a>', url, obj.last_task_id)

    @admin.display(description="runs")
    def runs(self, obj):
        return format_html('<a href="{}">runs</a>', runs_url(obj))

    @admin.display(description="health")
    def health(self, obj):
        if obj.last_error:
            return format_html('<span title="{}">error</span>', obj.last_error)
        return "ok" if obj.enabled else "paused"

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change and obj.declared_in_code:
            saved = schedule_set_enabled(name=obj.name, enabled=data["enabled"])
        else:
            saved, _ = schedule_save(name=data.get("name", obj.name), workflow=data["workflow"],
                                     cron=data["cron"], payload=data.get("payload") or {},
                                     owner=data["owner"], missed=data["missed"],
                                     enabled=data["enabled"], origin=ScheduleOrigin.OPERATOR)
        obj.pk, obj.owner = saved.pk, saved.owner  # the admin's redirect and LogEntry need them

    def delete_model(self, request, obj):
        schedule_delete(name=obj.name, origin=obj.origin)

    def delete_queryset(self, request, queryset):
        # Only operator schedules get here: has_delete_permission refuses the
        # whole bulk delete when it includes one declared in code.
        for schedule in queryset:
            schedule_delete(name=schedule.name, origin=schedule.origin)

    def has_delete_permission(self, request, obj=None):
        # A code-declared schedule would come back at the next sync: pause it instead.
        if obj is not None and obj.declared_in_code:
            return False
        return super().has_delete_permission(request, obj)

    @admin.action(description="Resume selected schedules (from the next slot)",
                  permissions=["change"])
    def enable_selected(self, request, queryset):
        self._set_enabled(request, queryset, True)

    @admin.action(description="Pause selected schedules", permissions=["change"])
    def disable_selected(self, request, queryset):
        self._set_enabled(request, queryset, False)

    def _set_enabled(self, request, queryset, enabled: bool):
        if not may_choose_owner(request.user):
            held = queryset.exclude(**_owned_by_scheduler())
            if held.exists():
                self.message_user(request, "Left as they are (they run as another user; "
                                  f"{OWNER_PERMISSION} is needed): "
                                  f"{', '.join(held.values_list('name', flat=True))}",
                                  messages.WARNING)
            queryset = queryset.filter(**_owned_by_scheduler())
        names = list(queryset.values_list("name", flat=True))
        for name in names:
            schedule_set_enabled(name=name, enabled=enabled)
        self.message_user(request, f"{'Resumed' if enabled else 'Paused'} {len(names)} "
                                   f"schedule(s): {', '.join(names)}", messages.SUCCESS)


def _owned_by_scheduler() -> dict[str, str]:
    return {f"owner__{k}": v for k, v in user_by_name_filter(SCHEDULER_OWNER).items()}
