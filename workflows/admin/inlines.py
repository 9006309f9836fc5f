"""Read-only inlines of the task page: step checkpoints and the transition history."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from workflows.admin.text import duration_text, pretty_json, state_badge, timestamp_field
from workflows.models import StepCheckpoint, TaskTransition


class _ReadOnlyInline(admin.TabularInline):
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class StepCheckpointInline(_ReadOnlyInline):
    model = StepCheckpoint
    verbose_name = "step"
    verbose_name_plural = "steps (checkpoints)"
    fields = ["index", "name", "step_state", "attempts", "started", "finished",
              "took", "step_output", "error"]
    readonly_fields = fields
    ordering = ["index"]

    @admin.display(description="state")
    def step_state(self, obj):
        return state_badge(obj.state, step=True)

    started = timestamp_field("started_at", "started (UTC)")
    finished = timestamp_field("finished_at", "finished (UTC)")

    @admin.display(description="duration")
    def took(self, obj):
        return duration_text(obj.started_at, obj.finished_at)

    @admin.display(description="output")
    def step_output(self, obj):
        return pretty_json(obj.output)


class TaskTransitionInline(_ReadOnlyInline):
    model = TaskTransition
    verbose_name = "transition"
    verbose_name_plural = "history (transitions)"
    fields = ["when", "actor", "from_to", "transition", "reason"]
    readonly_fields = fields
    ordering = ["at", "id"]

    when = timestamp_field("at", "when (UTC)")

    @admin.display(description="from → to")
    def from_to(self, obj):
        return format_html("{} → {}", state_badge(obj.from_state), state_badge(obj.to_state))
