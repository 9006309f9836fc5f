"""The console's live updates: one small JSON endpoint, `live/?view=…`, that
renders again the parts of a page that change, with the same templates and
the same permissions as the page itself (console.js swaps them in).

    ?view=task&id=<uuid>         the task page's live part; `state` lets the
                                 page reload itself when the task changes state
    ?view=list&params=<query>    the task list's rows for the list's query string
    ?view=dashboard              the dashboard
    ?view=workers                the Workers & queue page

Answers `{"now": ISO time, "state": …, "fragments": {element id: html}}`, or
`{"error": …}` with 400, 403 or 404. Reads only.
"""

from __future__ import annotations

from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse, QueryDict
from django.template.loader import render_to_string

from workflows.admin.clock import console_now
from workflows.admin.dashboard import dashboard_context, require_view_all
from workflows.admin.deliveries import can_resend
from workflows.admin.list_params import list_params_check, problems_text
from workflows.admin.task_page import task_page
from workflows.admin.text import state_badge
from workflows.admin.workers import work_status

MAX_PARAMS = 2000


def _answer(now, fragments: dict, **extra) -> JsonResponse:
    response = JsonResponse({"now": now.isoformat(), "fragments": fragments, **extra})
    response["Cache-Control"] = "no-store"
    return response


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _task(model_admin, request, now):
    task = model_admin.get_object(request, request.GET.get("id", ""))
    if task is None:
        return _error(404, "No such task")
    context = {**task_page(task, now=now), "badge": state_badge(task.state),
               "can_resend": can_resend(request.user)}
    html = render_to_string("pilot/admin/task_live.html", context, request)
    return _answer(now, {"pilot-task-live": html}, state=task.state,
                   finished=task.is_finished)


def _list(model_admin, request, now):
    raw = request.GET.get("params", "")
    if len(raw) > MAX_PARAMS:
        return _error(400, "The list's query string is too long")
    kept, problems = list_params_check(QueryDict(raw))
    if problems:
        return _error(400, f"Bad filter: {problems_text(problems)}")
    original = request.GET
    request.GET = kept
    try:
        cl = model_admin.get_changelist_instance(request)
        cl.formset = None  # changelist_view sets it; the list has no editable columns
        html = render_to_string("pilot/admin/task_list_live.html",
                                {"cl": cl, "opts": cl.opts}, request)
    except IncorrectLookupParameters as exc:
        return _error(400, f"Bad filter: {exc}")
    finally:
        request.GET = original
    return _answer(now, {"pilot-results": html}, count=cl.result_count)


def _dashboard(model_admin, request, now):
    require_view_all(request, "dashboard")
    html = render_to_string("pilot/admin/dashboard_live.html", dashboard_context(now), request)
    return _answer(now, {"pilot-dashboard-live": html})


def _workers(model_admin, request, now):
    require_view_all(request, "Workers & queue page")
    html = render_to_string("pilot/admin/workers_live.html",
                            {"now": now, "work": work_status(now)}, request)
    return _answer(now, {"pilot-workers-live": html})


VIEWS = {"task": _task, "list": _list, "dashboard": _dashboard, "workers": _workers}


def live_view(model_admin, request):
    if not model_admin.has_view_permission(request):
        return _error(403, "Live updates need the permission workflows.view_task")
    render = VIEWS.get(request.GET.get("view", ""))
    if render is None:
        return _error(400, f"view must be one of {', '.join(VIEWS)}")
    try:
        return render(model_admin, request, console_now())
    except PermissionDenied as exc:
        return _error(403, str(exc))
