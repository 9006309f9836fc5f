"""The dashboard and the Workers & queue page: what is running, who runs it,
what waits, what failed, what was triggered twice. Both refresh live
(workflows/admin/live.py renders the same parts again)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from workflows.admin import fleet_webhooks, stats
from workflows.admin.clock import console_now
from workflows.admin.pictures.chart import SERIES, activity_chart
from workflows.admin.pictures.svg import STATE_COLORS
from workflows.admin.text import count_text
from workflows.admin.workers import work_status
from workflows.selectors import task_counts_by_state

VIEW_ALL = "workflows.view_all_tasks"


def require_view_all(request, page: str) -> None:
    """Both pages describe every client's tasks."""
    if not request.user.has_perm(VIEW_ALL):
        raise PermissionDenied(f"The {page} needs the permission {VIEW_ALL}")


def dashboard_context(now) -> dict:
    """Counts by state, activity per hour over 24 h (chart and table), workers
    and queue with the stuck tasks (workers.tasks_stuck, as on Workers &
    queue), the oldest pending tasks, the tasks waiting for a person, the
    top failing workflows and the webhooks failing."""
    counts = task_counts_by_state()
    buckets = stats.activity_per_hour(now)
    totals = [(name, legend, colour, sum(getattr(b, name) for b in buckets))
              for name, legend, colour in SERIES]
    return {
        "now": now,
        # .get: a state added to the model before it has a colour still counts.
        "state_counts": [(state, count_text(n, state not in counts.estimated),
                          STATE_COLORS.get(state, "#6b7280"))
                         for state, n in counts.items()],
        "total_tasks": count_text(sum(counts.values()), not counts.estimated),
        "chart": activity_chart(buckets),
        "buckets": buckets,
        "series": SERIES,
        "totals": totals,
        "work": work_status(now, shares=False),
        "oldest_pending": stats.tasks_oldest_pending(),
        "waiting_for_a_person": stats.tasks_waiting_for_a_person(),
        "top_failing": stats.workflows_top_failing(now),
        "webhooks": fleet_webhooks.failing_summary(now),
    }


def dashboard_view(model_admin, request):
    require_view_all(request, "dashboard")
    return TemplateResponse(request, "pilot/admin/dashboard.html", {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Dashboard",
        **dashboard_context(console_now()),
    })


def workers_view(model_admin, request):
    """Clusters, workers (busy with which task, idle), the broker's queue and
    the tasks waiting for a worker or in backoff."""
    require_view_all(request, "Workers & queue page")
    now = console_now()
    return TemplateResponse(request, "pilot/admin/workers.html", {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Workers & queue",
        "now": now,
        "work": work_status(now),
    })
