"""The pages of the filter-wide actions (see workflows/admin/bulk.py)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.http import Http404, HttpResponseRedirect, JsonResponse, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse

from workflows.admin.bulk import (
    CHUNK,
    BadFilter,
    bulk_action,
    bulk_outlook,
    bulk_sample,
    bulk_summary,
    filter_names,
    filtered_tasks,
    job_chunk,
    job_load,
    job_now,
    new_job,
)
from workflows.admin.clock import console_now
from workflows.admin.forms import ReasonForm
from workflows.admin.workers import live_workers

MAX_REFUSALS_SHOWN = 100


def _context(model_admin, request, **extra) -> dict:
    return {**model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
            **extra}


def _list_url(filters) -> str:
    base = reverse("admin:workflows_task_changelist")
    query = filters.urlencode()
    return f"{base}?{query}" if query else base


def _count(value) -> int:
    """A counter the progress page carries between chunks (display only)."""
    ok = isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 10
    return int(value) if ok else 0


def bulk_confirm_view(model_admin, request, action_name: str):
    """GET: the dry run over the list's filters (the query string). POST with a
    reason: start the job and go to its progress page."""
    action = bulk_action(action_name, request, model_admin)
    filters = request.GET.copy()
    back_url = _list_url(filters)
    form = ReasonForm(request.POST if request.method == "POST" else None)
    try:
        queryset = filtered_tasks(model_admin, request, filters)
    except BadFilter as exc:
        return TemplateResponse(request, "pilot/admin/bulk_confirm.html", _context(
            model_admin, request, title=f"{action.label} everything matching: bad filter",
            action=action, filter_error=str(exc), back_url=_list_url(QueryDict())),
            status=400)
    summary = bulk_summary(action, queryset)
    would_change = sum(row.count for row in summary if row.changes)
    if request.method == "POST" and form.is_valid() and would_change:
        job = new_job(action, filters, form.cleaned_data["reason"], request.user, would_change)
        run = reverse("admin:workflows_task_bulk_run", args=[action.name])
        return HttpResponseRedirect(f"{run}?{urlencode({'job': job.token()})}")
    return TemplateResponse(request, "pilot/admin/bulk_confirm.html", _context(
        model_admin, request, title=f"{action.label} everything matching this filter",
        action=action, summary=summary, would_change=would_change,
        total=sum(row.count for row in summary), chunk=CHUNK,
        plan=bulk_sample(action, queryset) if would_change else [],
        outlook=bulk_outlook(action, queryset, now=console_now(), workers=live_workers)
        if would_change else None,
        filters=filter_names(filters),
        form=form, back_url=back_url))


def bulk_run_view(model_admin, request, action_name: str):
    """GET: the progress page. POST: one chunk; JSON for the page's script,
    or the progress page again (no script), or the outcome when done."""
    action = bulk_action(action_name, request, model_admin)
    token = request.POST.get("job") or request.GET.get("job") or ""
    job = job_load(token, request.user)
    if job.action.name != action.name:
        raise Http404("This job is for another action")
    handled, changed, refused = (_count(request.POST.get(k)) for k in
                                 ("handled", "changed", "refused"))
    cursor, refusals = "", []
    if request.method == "POST":
        chunk = job_chunk(model_admin, request, job, request.POST.get("cursor", ""))
        handled += chunk.handled
        changed += chunk.changed
        refused += len(chunk.refusals)
        refusals, cursor = chunk.refusals, chunk.cursor
        done_url = reverse("admin:workflows_task_bulk_done", args=[action.name]) + "?" + \
            urlencode({"job": token, "handled": handled, "changed": changed,
                       "refused": refused})
        if request.headers.get("Accept", "").startswith("application/json"):
            return JsonResponse({"handled": handled, "changed": changed, "refused": refused,
                                 "cursor": cursor, "done": not cursor, "done_url": done_url,
                                 "refusals": refusals[:MAX_REFUSALS_SHOWN]})
        if not cursor:
            return HttpResponseRedirect(done_url)
    return TemplateResponse(request, "pilot/admin/bulk_progress.html", _context(
        model_admin, request, title=f"{action.label}: in progress", action=action, job=job,
        token=token, handled=handled, changed=changed, refused=refused, cursor=cursor,
        refusals=refusals[:MAX_REFUSALS_SHOWN], back_url=_list_url(job.filters),
        started=request.method == "POST"))


def bulk_done_view(model_admin, request, action_name: str):
    """The outcome: the counters, and the job's tasks by their state now."""
    action = bulk_action(action_name, request, model_admin)
    job = job_load(request.GET.get("job", ""), request.user)
    return TemplateResponse(request, "pilot/admin/bulk_done.html", _context(
        model_admin, request, title=f"{action.label}: done", action=action, job=job,
        handled=_count(request.GET.get("handled")), changed=_count(request.GET.get("changed")),
        refused=_count(request.GET.get("refused")), now_rows=job_now(model_admin, request, job),
        back_url=_list_url(job.filters)))
