"""List filters for the task list whose choices must stay cheap on 100 000 tasks
and must not tell a user about tasks they may not see. Values reach them only
through `list_params.list_params_check`."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef

from workflows.models import Task
from workflows.registry import registry
from workflows.selectors import can_view_all

MAX_OWNERS = 100


class WorkflowFilter(admin.SimpleListFilter):
    """Choices from the registry, not a DISTINCT over the task table."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request, model_admin):
        return [(name, name) for name in registry.names()]

    def queryset(self, request, queryset):
        return queryset.filter(workflow=self.value()) if self.value() else queryset


class OwnerFilter(admin.SimpleListFilter):
    """Users that own at least one task (an EXISTS per user on
    pilot_task_owner_created_idx, instead of a DISTINCT over every task).

    Only for holders of `workflows.view_all_tasks`: everyone else sees only
    their own tasks, so the filter would offer nothing but a list of other
    clients' usernames — it has no choices for them, and Django hides it."""

    title = "owner"
    parameter_name = "owner"

    def lookups(self, request, model_admin):
        if not can_view_all(request.user):
            return []
        users = get_user_model()
        name = users.USERNAME_FIELD  # `username`, or the host's own (`email`)
        owners = (users.objects
                  .filter(Exists(Task.objects.filter(owner=OuterRef("pk"))))
                  .order_by(name).values_list("pk", name)[:MAX_OWNERS])
        return [(str(pk), username) for pk, username in owners]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        # list_params_check lets through only 1-18 ASCII digits; anything else
        # (a caller that skipped it) matches nobody rather than reaching the database.
        if not (value.isascii() and value.isdigit() and len(value) <= 18):
            return queryset.none()
        return queryset.filter(owner_id=int(value))


class WaitingForFilter(admin.SimpleListFilter):
    """Waiting tasks by what they wait for: a signal (a person's approval, a
    partner's answer), a timer (docs/waiting.md) or their children."""

    title = "waiting for"
    parameter_name = "waiting_for"
    CHOICES = (("signal", "a signal (a person)"), ("timer", "a timer"),
               ("children", "its children"))

    def lookups(self, request, model_admin):
        return self.CHOICES

    def queryset(self, request, queryset):
        value = self.value()
        if value not in dict(self.CHOICES):
            return queryset
        return queryset.filter(state="waiting", waiting_for__kind=value)


class ParentFilter(admin.SimpleListFilter):
    """A parent's children (the task page links here). Shown only while it
    filters: its one choice is the parent asked for."""

    title = "children of"
    parameter_name = "parent"

    def lookups(self, request, model_admin):
        value = self.value()
        return [(value, f"task {value[:8]}")] if value else []

    def queryset(self, request, queryset):
        return queryset.filter(parent_id=self.value()) if self.value() else queryset


class VersionFilter(admin.SimpleListFilter):
    """Tasks by the version of their workflow they run (the workflows page
    links here): offered once some workflow has several versions."""

    title = "version"
    parameter_name = "version"

    def lookups(self, request, model_admin):
        versions = {w.version for name in registry.names() for w in registry.versions(name)}
        if self.value():
            versions.add(int(self.value()))
        return [(str(v), f"version {v}") for v in sorted(versions)] if len(versions) > 1 else []

    def queryset(self, request, queryset):
        return queryset.filter(version=int(self.value())) if self.value() else queryset
