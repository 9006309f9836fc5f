"""The dashboard: what is running, what failed, what was triggered twice."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.utils import timezone

from workflows.admin import stats
from workflows.admin.chart import SERIES, activity_chart
from workflows.admin.svg import STATE_COLORS


def dashboard_view(model_admin, request):
    """Counts by state, activity per hour over 24 h (chart and table), tasks past
    their lease, the oldest pending tasks and the top failing workflows. Needs
    `workflows.view_all_tasks`: it describes every client's tasks."""
    if not request.user.has_perm("workflows.view_all_tasks"):
        raise PermissionDenied("The dashboard needs workflows.view_all_tasks")
    now = timezone.now()
    counts = stats.task_counts_by_state()
    buckets = stats.activity_per_hour(now)
    totals = [(name, legend, colour, sum(getattr(b, name) for b in buckets))
              for name, legend, colour in SERIES]
    return TemplateResponse(request, "pilot/admin/dashboard.html", {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Dashboard",
        "now": now,
        "state_counts": [(state, n, STATE_COLORS[state]) for state, n in counts.items()],
        "total_tasks": sum(counts.values()),
        "chart": activity_chart(buckets),
        "buckets": buckets,
        "series": SERIES,
        "totals": totals,
        "past_lease": stats.tasks_past_lease(now),
        "oldest_pending": stats.tasks_oldest_pending(),
        "top_failing": stats.workflows_top_failing(now),
    })
