"""The task list and the task page (SPEC §9).

Nobody edits a task here: add, change and delete are refused to everyone,
superusers included, so the change form can never save a stale row and the
page is read-only for all. The only ways to change a task are the operator
actions of `workflows.admin.actions`, reached from the page's buttons or the
list's bulk actions, both through a confirmation page (`confirm`) and the engine.

Why not django-fsm-2's `FSMAdminMixin`: its change-form path
(`response_change` with `_fsm_transition_to`) calls the transition without
`has_transition_perm`, then saves the instance itself outside the engine (no row lock, no
audit row, no enqueue), and its button list offers every permission-less worker
edge (`claim`, `succeed`, …) to any staff user. We keep django-fsm's own
`has_transition_perm` as the one test of "legal and permitted" and route every
change through the engine instead.
"""

from __future__ import annotations

import uuid

from django.contrib import admin
from django.db.models import Q
from django.urls import path
from django.utils import timezone

from workflows.admin import confirm, dashboard, trigger, workflows_page
from workflows.admin.actions import CANCEL, RETRY, RETRY_FROM_START, actions_available
from workflows.admin.filters import OwnerFilter, WorkflowFilter
from workflows.admin.inlines import StepCheckpointInline, TaskTransitionInline
from workflows.admin.text import duration_text, pretty_json, state_badge, timestamp_field
from workflows.admin.timeline import task_timeline
from workflows.models import StepCheckpoint, Task, TaskTransition
from workflows.selectors import tasks_visible_to

DETAIL_FIELDSETS = [
    (None, {"fields": ["id", "state_badge", "workflow", "idempotency_key", "owner", "source",
                       "trace_id"]}),
    ("Run", {"fields": ["attempts_of_max", "replays", "last_replayed_at", "next_attempt_at",
                        "lease_owner", "lease_token", "lease_expires_at"]}),
    ("Times (UTC)", {"fields": ["created", "enqueued", "started", "finished", "duration",
                                "expires", "updated"]}),
    ("Payload", {"fields": ["payload_json", "fingerprint"]}),
    ("Result", {"fields": ["result_json", "error_type", "error"]}),
]


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ["short_id", "state_badge", "workflow", "idempotency_key", "owner",
                    "attempts_of_max", "replays", "age", "duration"]
    list_display_links = ["short_id"]
    list_filter = ["state", WorkflowFilter, OwnerFilter, ("created_at", admin.DateFieldListFilter)]
    # The search itself is get_search_results; this only turns the search box on.
    search_fields = ["idempotency_key"]
    search_help_text = "A task id (or its first 8+ characters) or the start of an idempotency key."
    date_hierarchy = "created_at"
    list_select_related = ["owner"]
    list_per_page = 50
    # A second COUNT(*) over the whole table only to print "of N" is not worth it at 100 000.
    show_full_result_count = False
    ordering = ["-created_at"]
    actions = ["cancel_selected", "retry_selected", "retry_selected_from_start"]
    fieldsets = DETAIL_FIELDSETS
    readonly_fields = [name for _, options in DETAIL_FIELDSETS for name in options["fields"]]
    inlines = [StepCheckpointInline, TaskTransitionInline]

    class Media:
        css = {"all": ["pilot/console.css"]}

    # --- who may do what --------------------------------------------------------------

    def get_queryset(self, request):
        return tasks_visible_to(request.user)

    def has_add_permission(self, request):
        return False  # tasks are triggered (trigger form), never typed in

    def has_change_permission(self, request, obj=None):
        return False  # state, payload and result are never edited by hand

    def has_delete_permission(self, request, obj=None):
        return False  # cleanup_tasks deletes, by policy

    def has_cancel_permission(self, request):
        return CANCEL.permitted(request.user)

    def has_retry_permission(self, request):
        return RETRY.permitted(request.user)

    # --- search ----------------------------------------------------------------------

    def get_search_results(self, request, queryset, search_term):
        """A full UUID matches the id exactly; 8+ hex characters also match an id
        prefix; anything matches the start of a key (case-sensitive, like keys)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(Q(pk=uuid.UUID(term)) | Q(idempotency_key=term)), False
        except ValueError:
            pass
        match = Q(idempotency_key__startswith=term)
        compact = term.replace("-", "").lower()
        if len(compact) >= 8 and all(c in "0123456789abcdef" for c in compact):
            match |= Q(pk__in=_uuid_prefix_range(queryset, compact))
        return queryset.filter(match), False

    # --- columns and fields ----------------------------------------------------------------

    @admin.display(description="id", ordering="pk")
    def short_id(self, obj):
        return str(obj.pk)[:8]

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        return state_badge(obj.state)

    @admin.display(description="attempts")
    def attempts_of_max(self, obj):
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj):
        return duration_text(obj.created_at, timezone.now())

    @admin.display(description="duration")
    def duration(self, obj):
        if obj.started_at is None:
            return "–"
        return duration_text(obj.started_at, obj.finished_at or timezone.now())

    created = timestamp_field("created_at", "created")
    enqueued = timestamp_field("enqueued_at", "last enqueued")
    started = timestamp_field("started_at", "started")
    finished = timestamp_field("finished_at", "finished")
    expires = timestamp_field("expires_at", "key expires")
    updated = timestamp_field("updated_at", "updated")

    @admin.display(description="payload")
    def payload_json(self, obj):
        return pretty_json(obj.payload)

    @admin.display(description="result")
    def result_json(self, obj):
        return pretty_json(obj.result)

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, extra_context={
            **(extra_context or {}),
            "pilot_can_trigger": request.user.has_perm(trigger.TRIGGER_PERMISSION),
            "pilot_can_see_dashboard": request.user.has_perm("workflows.view_all_tasks"),
        })

    # --- the task page -------------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        task = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if task is not None:
            transitions = list(TaskTransition.objects.filter(task_id=task.pk).order_by("at", "id"))
            steps = list(StepCheckpoint.objects.filter(task_id=task.pk).order_by("index"))
            context["timeline_svg"] = task_timeline(task, transitions, steps, now=timezone.now())
            context["operator_actions"] = actions_available(task, request.user)
            context["title"] = f"Task {task.pk}"
        return super().change_view(request, object_id, form_url, extra_context=context)

    def get_urls(self):
        def view(fn):
            return self.admin_site.admin_view(lambda request, **kw: fn(self, request, **kw))

        return [
            path("dashboard/", view(dashboard.dashboard_view), name="workflows_task_dashboard"),
            path("trigger/", view(trigger.trigger_view), name="workflows_task_trigger"),
            path("workflows/", view(workflows_page.workflows_view),
                 name="workflows_task_workflows"),
            path("<path:object_id>/transition/<str:action_name>/",
                 view(confirm.transition_view), name="workflows_task_transition"),
            *super().get_urls(),
        ]

    # --- bulk actions (each through a dry-run confirmation page) ---------------------------

    @admin.action(permissions=["cancel"], description="Cancel selected tasks…")
    def cancel_selected(self, request, queryset):
        return confirm.bulk_view(self, request, queryset, CANCEL)

    @admin.action(permissions=["retry"], description="Retry selected tasks…")
    def retry_selected(self, request, queryset):
        return confirm.bulk_view(self, request, queryset, RETRY)

    @admin.action(permissions=["retry"], description="Retry selected tasks from the start…")
    def retry_selected_from_start(self, request, queryset):
        return confirm.bulk_view(self, request, queryset, RETRY_FROM_START)


def _uuid_prefix_range(queryset, prefix: str):
    """Ids starting with hex `prefix`, as a range on the primary key (an index
    scan on every database, where LIKE on a uuid column would not be)."""
    low = uuid.UUID(prefix.ljust(32, "0")[:32])
    high = uuid.UUID(prefix.ljust(32, "f")[:32])
    return queryset.filter(pk__gte=low, pk__lte=high).values("pk")

