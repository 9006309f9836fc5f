"""Every registered workflow: steps, policies, payload fields, its tasks by
state and failure rate, its versions and the tasks each still runs; the state
diagram."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.template.response import TemplateResponse

from workflows.admin.clock import console_now
from workflows.admin.pictures.diagram import state_diagram
from workflows.admin.schema import payload_fields
from workflows.admin.text import ttl_text
from workflows.registry import registry
from workflows.rules.states import FINISHED_STATES, TaskState
from workflows.selectors import can_view_all, tasks_visible_to

RATE_WINDOW = timedelta(hours=24)


def workflow_counts(user, now) -> tuple[dict, dict]:
    """({workflow: {state: n}} over the tasks `user` may see, {workflow:
    (failed, finished)} over those that finished in the last RATE_WINDOW).
    Two GROUP BY queries."""
    visible = tasks_visible_to(user).order_by()
    counts: dict = defaultdict(dict)
    for workflow, state, n in visible.values_list("workflow", "state").annotate(n=Count("*")):
        counts[workflow][state] = n
    recent: dict = defaultdict(lambda: [0, 0])
    rows = (visible.filter(finished_at__gte=now - RATE_WINDOW)
            .values_list("workflow", "state").annotate(n=Count("*")))
    for workflow, state, n in rows:
        recent[workflow][1] += n
        if state == TaskState.FAILED:
            recent[workflow][0] += n
    return counts, recent


def open_by_version(user) -> dict[str, dict[int, int]]:
    """{workflow: {version: tasks not finished}} over the tasks `user` may
    see: what still runs each version, so an operator knows when old code may
    go. One GROUP BY over the unfinished tasks (few, by the state index)."""
    rows = (tasks_visible_to(user).order_by().exclude(state__in=FINISHED_STATES)
            .values_list("workflow", "version").annotate(n=Count("*")))
    found: dict = defaultdict(dict)
    for workflow, version, n in rows:
        found[workflow][version] = n
    return found


def versions_of(workflow, still_open: dict[int, int]) -> list[dict]:
    """Each version registered or still run by a task, newest first."""
    registered = {w.version for w in registry.versions(workflow.name)}
    return [{"version": v, "registered": v in registered, "newest": v == workflow.version,
             "open": still_open.get(v, 0)}
            for v in sorted(registered | set(still_open), reverse=True)]


def workflows_view(model_admin, request):
    if not model_admin.has_view_permission(request):
        raise PermissionDenied("The workflows page needs the permission workflows.view_task")
    counts, recent = workflow_counts(request.user, console_now())
    still_open = open_by_version(request.user)
    workflows = []
    for workflow in registry.all():
        described = workflow.describe()
        described["payload_fields"] = payload_fields(workflow)
        described["plan_note"] = ("runs a prefix of these steps chosen by its payload"
                                  if workflow.plan else "")
        described["ttl_text"] = ttl_text(workflow.idempotency_ttl)
        by_state = counts.get(workflow.name, {})
        described["counts"] = [(s, by_state.get(s, 0)) for s in TaskState.values]
        described["total"] = sum(by_state.values())
        failed, finished = recent.get(workflow.name, (0, 0))
        described["failed_24h"], described["finished_24h"] = failed, finished
        described["failure_rate"] = f"{100 * failed / finished:.1f} %" if finished else "–"
        described["version_rows"] = versions_of(workflow, still_open.get(workflow.name, {}))
        workflows.append(described)
    return TemplateResponse(request, "pilot/admin/workflows.html", {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Workflows",
        "workflows": workflows,
        "diagram": state_diagram(),
        "all_clients": can_view_all(request.user),
        "can_trigger": request.user.has_perm("workflows.add_task"),
    })
