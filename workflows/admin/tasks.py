"""The task list and the read-only task page (docs/design.md, "The console").

Nobody edits a task here: add, change and delete are refused to everyone,
superusers included, so the change form can never save a stale row and the
page is read-only for all. The only ways to change a task are the operator
actions of `workflows.admin.actions`, reached from the page's buttons, the
list's bulk actions or the filter-wide actions, all through a dry run and the
engine.

Why not django-fsm-2's `FSMAdminMixin`: its change-form path
(`response_change` with `_fsm_transition_to`) calls the transition without
`has_transition_perm`, then saves the instance itself outside the engine (no row lock, no
audit row, no enqueue), and its button list offers every permission-less worker
edge (`claim`, `succeed`, …) to any staff user. We keep django-fsm's own
`has_transition_perm` as the one test of "legal and permitted" and route every
change through the engine instead.
"""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.views.main import ALL_VAR, ORDER_VAR
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.db.models.functions import Substr
from django.http import HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html

from workflows.admin import (
    bulk_views,
    confirm,
    dashboard,
    deliveries,
    live,
    signals,
    trigger,
    workflows_page,
)
from workflows.admin.actions import CANCEL, RETRY, RETRY_FROM_START, actions_available
from workflows.admin.clock import DB_NOW, console_now
from workflows.admin.filters import (
    OwnerFilter,
    ParentFilter,
    VersionFilter,
    WaitingForFilter,
    WorkflowFilter,
)
from workflows.admin.list_params import list_params_check, problems_text
from workflows.admin.paging import (
    CURSOR,
    EstimatedCountPaginator,
    UnfilteredShowsNoShowAll,
    cursor_parse,
    cursor_text,
    older_than,
)
from workflows.admin.search import (
    blank_ranges_dropped,
    search_tasks,
    time_range_context,
    view_query,
)
from workflows.admin.task_page import task_page
from workflows.admin.text import (
    count_text,
    duration_text,
    pretty_json,
    state_badge,
    timestamp,
    timestamp_field,
)
from workflows.admin.workers import live_workers
from workflows.engine import why_not_running
from workflows.models import StepCheckpoint, Task, TaskTransition
from workflows.rules.states import LEASED_STATES, StepState, TaskState
from workflows.selectors import can_view_all, tasks_visible_to

ERROR_CHARS = 120
KEY_CHARS = 28


def _now(task: Task) -> datetime:
    """The database's now as read with the row (the list's queryset), else as
    read now."""
    return getattr(task, "pilot_now", None) or console_now()


class TaskChangeList(UnfilteredShowsNoShowAll):
    """The list's rows: without payload and result (up to 256 KiB each), with
    the head of the error and the running step's name (one subquery per row
    of the page, on step_task_index_uniq)."""

    def get_queryset(self, request, exclude_parameters=None):
        running_step = (StepCheckpoint.objects.filter(task_id=OuterRef("pk"),
                                                      state=StepState.RUNNING)
                        .order_by("-index").values("name")[:1])
        return (super().get_queryset(request, exclude_parameters)
                .defer("payload", "result", "error")
                .annotate(error_head=Substr("error", 1, ERROR_CHARS + 1),
                          current_step=Subquery(running_step), pilot_now=DB_NOW))

    def get_filters_params(self, params=None):
        lookup = super().get_filters_params(params)
        lookup.pop(CURSOR, None)  # a position in the list, not a filter
        return lookup

    def get_results(self, request):
        self._get_results(request)
        # Why each waiting row is not running: one snapshot of the caps for the
        # page (and the workers' status records only if a row is due), never a
        # query per row (engine/why.py).
        rows = list(self.result_list)
        answers = why_not_running(rows, now=_now(rows[0]), workers=live_workers) if rows else {}
        for task in rows:
            task.pilot_why = answers.get(task.pk)

    def _get_results(self, request):
        """Django's results, then — in the default order, newest first — the
        page after `?before=` by keyset instead of OFFSET (workflows.admin.paging),
        with the links to the newest and the next older page."""
        super().get_results(request)
        self.pilot_count = count_text(self.result_count, self.paginator.exact)
        # A column order, "show all" or an old ?p= link: Django's own pages.
        self.pilot_keyset = (ORDER_VAR not in self.params and ALL_VAR not in self.params
                             and self.page_num <= 1)
        self.pilot_newer_url = self.pilot_older_url = None
        if not self.pilot_keyset:
            return
        cursor = cursor_parse(self.params.get(CURSOR, ""))
        rows = older_than(self.queryset, cursor) if cursor else self.queryset
        self.result_list = list(rows[:self.list_per_page])
        self.multi_page = self.multi_page or cursor is not None
        if cursor is not None:
            self.pilot_newer_url = self.get_query_string(remove=[CURSOR])
        if len(self.result_list) == self.list_per_page:
            self.pilot_older_url = self.get_query_string(
                {CURSOR: cursor_text(self.result_list[-1])})


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ["short_id", "state_badge", "workflow_link", "key_short", "owner",
                    "attempts_of_max", "replays", "age", "duration", "step_or_error",
                    "why_not_running"]
    list_display_links = ["short_id"]
    list_filter = ["state", WaitingForFilter, WorkflowFilter, VersionFilter, ParentFilter,
                   OwnerFilter,
                   ("created_at", admin.DateFieldListFilter)]
    # The search itself is get_search_results; this only turns the search box on.
    search_fields = ["idempotency_key"]
    search_help_text = ("A task id (or its first 8+ characters), payload.order_id=42 (a payload "
                        "field; payload.a.b=x for nested keys), error:timeout (text in the last "
                        "error) or the start of an idempotency key.")
    # No date_hierarchy: its links come from a DISTINCT date_trunc over every
    # matching task (4 s at 10 M); the created_at filter covers the same need.
    # No facets either: they are a COUNT per choice over the whole table.
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    list_select_related = ["owner"]
    list_per_page = 50
    # A second COUNT(*) over the whole table only to print "of N" is not worth it.
    show_full_result_count = False
    ordering = ["-created_at"]
    actions = ["cancel_selected", "retry_selected", "retry_selected_from_start"]
    readonly_fields = ["payload_json", "fingerprint", "result_json", "source", "trace_id",
                       "traceparent", "callback_url",
                       "attempts_of_max", "replays", "last_replayed", "next_attempt_at",
                       "lease_owner", "lease_token", "lease_expires_at", "created", "enqueued",
                       "started", "finished", "duration", "expires", "updated"]
    object_history_template = "admin/workflows/task/object_history.html"

    # --- who may do what --------------------------------------------------------------

    def get_queryset(self, request):
        return tasks_visible_to(request.user)

    def get_changelist(self, request, **kwargs):
        return TaskChangeList

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
        """A task id (or 8+ of its first hex characters), `payload.<path>=<value>`,
        `error:<text>` or the start of a key (workflows/admin/search.py)."""
        return search_tasks(queryset, search_term), False

    # --- list columns ----------------------------------------------------------------------

    @admin.display(description="id", ordering="pk")
    def short_id(self, obj):
        return str(obj.pk)[:8]

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        return state_badge(obj.state)

    @admin.display(description="workflow", ordering="workflow")
    def workflow_link(self, obj):
        return format_html('<a href="?{}" title="tasks of this workflow">{}</a>',
                           urlencode({"workflow": obj.workflow}), obj.workflow)

    @admin.display(description="key", ordering="idempotency_key")
    def key_short(self, obj):
        key = obj.idempotency_key
        shown = key if len(key) <= KEY_CHARS else key[:KEY_CHARS - 1] + "…"
        return format_html('<span title="{}">{}</span>', key, shown)

    @admin.display(description="attempts")
    def attempts_of_max(self, obj):
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj):
        return format_html('<span title="created {}">{}</span>', timestamp(obj.created_at),
                           duration_text(obj.created_at, _now(obj)))

    @admin.display(description="duration")
    def duration(self, obj):
        if obj.started_at is None:
            return "–"
        return duration_text(obj.started_at, obj.finished_at or _now(obj))

    @admin.display(description="step / error")
    def step_or_error(self, obj):
        """The running step of a running task; the head of the error of a
        failed or retrying one."""
        step = getattr(obj, "current_step", None)
        if obj.state in LEASED_STATES and step:
            return format_html('<span class="pilot-step-now">▶ {}</span>', step)
        head = getattr(obj, "error_head", None)
        if obj.state in (TaskState.FAILED, TaskState.RETRYING) and head:
            shown = head if len(head) <= ERROR_CHARS else head[:ERROR_CHARS - 1] + "…"
            return format_html('<span class="pilot-error-head" title="{}">{}</span>', head,
                               shown)
        return ""

    @admin.display(description="why not running")
    def why_not_running(self, obj):
        """Why a task that waits is not running: a wait, a delayed start, a
        backoff, a cap (with its count), no live worker — or queued."""
        why = getattr(obj, "pilot_why", None)
        if why is None:
            return ""
        until = f" — due {timestamp(why.until, ms=False)}" if why.until else ""
        return format_html('<span class="pilot-why pilot-why-{}" data-why="{}">{}{}</span>',
                           why.kind, why.kind, why.text, until)

    # --- the task page's fields (below its live part) ------------------------------------

    def get_fieldsets(self, request, obj=None):
        run = ["attempts_of_max", "replays", "last_replayed", "next_attempt_at", "source",
               "trace_id", "traceparent", "fingerprint"]
        if obj is not None and not obj.is_finished:
            run += ["lease_owner", "lease_token", "lease_expires_at"]
        return [
            ("Payload", {"fields": ["payload_json"]}),
            ("Result", {"fields": ["result_json"]}),
            ("Run details", {"fields": run, "classes": ["collapse"]}),
            ("Times (UTC)", {"fields": ["created", "enqueued", "started", "finished",
                                        "duration", "expires", "updated"],
                             "classes": ["collapse"]}),
        ]

    created = timestamp_field("created_at", "created")
    enqueued = timestamp_field("enqueued_at", "last enqueued")
    started = timestamp_field("started_at", "started")
    finished = timestamp_field("finished_at", "finished")
    expires = timestamp_field("expires_at", "key expires")
    updated = timestamp_field("updated_at", "updated")

    @admin.display(description="last replayed at")
    def last_replayed(self, obj):
        """When a duplicate trigger was last absorbed; "never" rather than None."""
        at = obj.last_replayed_at
        return "never" if at is None else timestamp(at)

    @admin.display(description="payload")
    def payload_json(self, obj):
        return pretty_json(obj.payload)

    @admin.display(description="result")
    def result_json(self, obj):
        return pretty_json(obj.result)

    # --- pages -------------------------------------------------------------------------

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied("The task list needs the permission workflows.view_task")
        # The range form sends its empty boxes too: an empty one is no bound.
        request.GET = blank_ranges_dropped(request.GET)
        kept, problems = list_params_check(request.GET)
        if problems:
            messages.error(request, f"Filter ignored — {problems_text(problems)}.")
            query = kept.urlencode()
            return HttpResponseRedirect(request.path + (f"?{query}" if query else ""))
        query = request.GET.urlencode()
        now = console_now()
        view = view_query(request.GET)
        live_default = "on" if request.GET.get("state__exact") in LEASED_STATES else "off"
        return super().changelist_view(request, extra_context={
            **(extra_context or {}),
            "pilot_can_trigger": request.user.has_perm(trigger.TRIGGER_PERMISSION),
            "pilot_can_see_all": can_view_all(request.user),
            "pilot_filter_actions": [
                (a, reverse("admin:workflows_task_bulk", args=[a.name]) + f"?{query}")
                for a in (CANCEL, RETRY) if a.permitted(request.user)],
            "live_url": reverse("admin:workflows_task_live") + "?"
            + urlencode({"view": "list", "params": query}),
            "live_default": live_default,
            "live_key": f"list-{request.GET.get('state__exact', 'all')}",
            "now": now,
            "pilot_view_url": request.build_absolute_uri(
                request.path + (f"?{view}" if view else "")),
            **time_range_context(request.GET, now),
        })

    def change_view(self, request, object_id, form_url="", extra_context=None):
        task = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if task is not None:
            context = {**context, **task_page(task, now=console_now())}
            context["badge"] = state_badge(task.state)
            context["operator_actions"] = actions_available(task, request.user)
            context["can_retry_from"] = RETRY in context["operator_actions"]
            context["can_resend"] = deliveries.can_resend(request.user)
            context["can_signal"] = signals.can_signal(request.user)
            context["title"] = f"Task {task.pk}"
            context["live_url"] = reverse("admin:workflows_task_live") + "?" + urlencode(
                {"view": "task", "id": str(task.pk)})
            # A finished task changes only when someone acts on it (and the page then reloads).
            context["live_default"] = "off" if task.is_finished else "on"
        return super().change_view(request, object_id, form_url, extra_context=context)

    def history_view(self, request, object_id, extra_context=None):
        """Django's History (the console actions logged for this task) and the
        task's own transition history, which the engine wrote."""
        task = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if task is not None:
            context["transitions"] = list(TaskTransition.objects.filter(task_id=task.pk)
                                          .order_by("at", "id"))
        return super().history_view(request, object_id, extra_context=context)

    def get_urls(self):
        def view(fn):
            return self.admin_site.admin_view(lambda request, **kw: fn(self, request, **kw))

        return [
            path("dashboard/", view(dashboard.dashboard_view), name="workflows_task_dashboard"),
            path("workers/", view(dashboard.workers_view), name="workflows_task_workers"),
            path("live/", view(live.live_view), name="workflows_task_live"),
            path("trigger/", view(trigger.trigger_view), name="workflows_task_trigger"),
            path("workflows/", view(workflows_page.workflows_view),
                 name="workflows_task_workflows"),
            path("bulk/<str:action_name>/", view(bulk_views.bulk_confirm_view),
                 name="workflows_task_bulk"),
            path("bulk/<str:action_name>/run/", view(bulk_views.bulk_run_view),
                 name="workflows_task_bulk_run"),
            path("bulk/<str:action_name>/done/", view(bulk_views.bulk_done_view),
                 name="workflows_task_bulk_done"),
            path("<path:object_id>/transition/<str:action_name>/",
                 view(confirm.transition_view), name="workflows_task_transition"),
            path("<path:object_id>/signal/", view(signals.signal_view),
                 name="workflows_task_signal"),
            path("<path:object_id>/webhook/<int:delivery_id>/resend/",
                 view(deliveries.resend_view), name="workflows_task_resend"),
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

