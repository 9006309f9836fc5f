"""Cancel / retry everything matching the list's filter, at incident scale.

Three pages, one behaviour as the per-task actions (an engine call per task,
each its own transaction, refusals reported, nothing written by the admin):

1. `bulk/<action>/?<the list's filters>` — the dry run: a summary first (how
   many tasks in each state, and what each state would become), a sample of
   the tasks that would change with their per-task plan, a reason field.
   Confirm is not offered when nothing would change. "Back" returns to the
   list with its filters.
2. On confirm, a signed *job* (action, filters, reason, the user, a cut-off
   time: tasks created after confirming are never swept up) and the progress
   page: the browser posts one chunk after another (`CHUNK` tasks each, a
   second or two); without JavaScript a "Continue" button does the same. Each
   chunk walks the filtered tasks newest first by (created_at, id) after the
   last one handled, so every matching task is visited once, whatever the
   state changes in between; its changes are written to Django's admin log.
3. The outcome: counts, and the tasks of the job as they are *now*, per state,
   each a link to the list filtered that way.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, Q
from django.db.models.functions import Substr
from django.http import Http404, QueryDict
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from workflows.admin.actions import ACTIONS, OperatorAction, actions_apply, actions_plan
from workflows.admin.audit import action_message, console_action_log
from workflows.admin.list_params import MAX_OFFSET, list_params_check, problems_text
from workflows.conf import pilot_settings
from workflows.engine import client_shares
from workflows.models import Task
from workflows.registry import registry
from workflows.rules.states import TaskState

CHUNK = 200
SAMPLE = 25
JOB_SALT = "pilot.admin.bulk-job"
JOB_MAX_AGE = 24 * 3600
# Where each transition can start; every other state is "no change".
APPLICABLE = {
    "cancel": (TaskState.PENDING, TaskState.RETRYING, TaskState.RUNNING),
    "retry": (TaskState.FAILED, TaskState.CANCELLED),
}
OUTCOMES: dict[tuple[str, str], str] = {
    ("cancel", TaskState.RUNNING): "→ cancelling: its worker stops at the next heartbeat or "
                                   "step boundary, compensates, then it is cancelled",
    ("cancel", TaskState.PENDING): "→ cancelled at once (→ cancelling first where finished "
                                   "steps have compensations to run)",
    ("cancel", TaskState.RETRYING): "→ cancelled at once (→ cancelling first where finished "
                                    "steps have compensations to run)",
    ("retry", TaskState.FAILED): "→ pending, resuming from its checkpoints",
    ("retry", TaskState.CANCELLED): "→ pending, resuming from its checkpoints",
}


class BadFilter(Exception):
    """The filters cannot select tasks (a parameter the list refuses)."""


@dataclasses.dataclass
class SummaryRow:
    state: str
    count: int
    changes: bool
    outcome: str


@dataclasses.dataclass
class Job:
    action: OperatorAction
    filters: QueryDict
    reason: str
    cutoff: datetime
    user_id: int
    total: int

    def token(self) -> str:
        return signing.dumps({"a": self.action.name, "f": self.filters.urlencode(),
                              "r": self.reason, "c": self.cutoff.isoformat(),
                              "u": self.user_id, "n": self.total},
                             salt=JOB_SALT, compress=True)


def bulk_action(action_name: str, request, model_admin) -> OperatorAction:
    """The action, if it exists (404) and the user may take it (403, naming the
    permission)."""
    action = ACTIONS.get(action_name)
    if action is None:
        raise Http404("No such action")
    if not (action.permitted(request.user) and model_admin.has_view_permission(request)):
        raise PermissionDenied(f"{action.label} needs the permission {action.permission} "
                               "(and workflows.view_task)")
    return action


def filtered_tasks(model_admin, request, filters: QueryDict):
    """The tasks the list shows `request.user` for `filters` — its filters,
    search and scope (their own tasks without view_all_tasks). Raises BadFilter."""
    kept, problems = list_params_check(filters)
    if problems:
        raise BadFilter(problems_text(problems))
    original = request.GET
    request.GET = kept
    try:
        return model_admin.get_changelist_instance(request).queryset
    except IncorrectLookupParameters as exc:
        raise BadFilter(str(exc)) from None
    finally:
        request.GET = original


def transition_of(action: OperatorAction) -> str:
    return "cancel" if action.transition == "cancel" else "retry"


def bulk_summary(action: OperatorAction, queryset) -> list[SummaryRow]:
    """Per state: how many tasks, and what the action would do to them (one GROUP BY)."""
    name = transition_of(action)
    rows = []
    counts = dict(queryset.order_by().values_list("state").annotate(n=Count("*")))
    for state in TaskState.values:
        n = counts.get(state, 0)
        if not n:
            continue
        outcome = OUTCOMES.get((name, state))
        rows.append(SummaryRow(state, n, outcome is not None,
                               outcome or f"no change: a {state} task cannot be "
                                          f"{'cancelled' if name == 'cancel' else 'retried'}"))
    return rows


def bulk_sample(action: OperatorAction, queryset) -> list:
    """The per-task dry run of the newest tasks that would change."""
    tasks = list(queryset.filter(state__in=APPLICABLE[transition_of(action)])
                 .select_related("owner").order_by("-created_at", "-pk")[:SAMPLE])
    return actions_plan(action, tasks)


@dataclasses.dataclass
class Outlook:
    """What a filter-wide retry would meet: the errors it retries, the fresh
    budget each task gets, and what stands before them once they are pending."""

    errors: list          # [(error head, count)], most common first, at most TOP_ERRORS
    errors_more: int      # tasks whose error is not among those shown
    no_error: int         # tasks retried without an error (cancelled ones, mostly)
    budgets: list         # [(workflow, version, count, max_attempts or None: gone)]
    ahead: int            # due tasks already waiting for a worker
    workers: int | None   # live workers (None: not known)
    caps: list            # [(client, held, cap, count retried)] of clients with a cap
    client_cap: int       # PILOT_MAX_RUNNING_PER_CLIENT (0: none)


TOP_ERRORS = 5
ERROR_HEAD = 200


def bulk_outlook(action: OperatorAction, queryset, *, now: datetime,
                 workers: Callable[[], int | None]) -> Outlook | None:
    """For a retry: the retried tasks' errors grouped by their first ERROR_HEAD
    characters, their workflows' fresh budgets (registry: the task's version),
    the due tasks ahead of them and each of their clients' share (engine/why.py
    `client_shares`, the engine's own count). Five GROUP BYs over the filter's
    retryable tasks and one over the queue; None for a cancel."""
    if transition_of(action) != "retry":
        return None
    retried = queryset.filter(state__in=APPLICABLE["retry"]).order_by()
    heads = list(retried.exclude(error="").annotate(head=Substr("error", 1, ERROR_HEAD))
                 .values("head").annotate(n=Count("*")).order_by("-n", "head")
                 .values_list("head", "n")[:TOP_ERRORS + 1])
    with_error = retried.exclude(error="").count()
    shown = heads[:TOP_ERRORS]
    budgets = []
    for workflow, version, n in (retried.values("workflow", "version").annotate(n=Count("*"))
                                 .order_by("workflow", "version")
                                 .values_list("workflow", "version", "n")):
        found = registry.find(workflow, version=version)
        budgets.append((workflow, version, n, found.max_attempts if found else None))
    due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
    ahead = Task.objects.filter(due, state__in=[TaskState.PENDING, TaskState.RETRYING],
                                attempts__lt=F("max_attempts")).count()
    per_owner = dict(retried.values("owner_id").annotate(n=Count("*"))
                     .values_list("owner_id", "n"))
    client_cap = int(pilot_settings.PILOT_MAX_RUNNING_PER_CLIENT)
    held = {owner_id: (h, cap) for owner_id, group, h, cap in client_shares() if not group}
    users = get_user_model()
    names = dict(users.objects.filter(pk__in=per_owner)
                 .values_list("pk", users.USERNAME_FIELD)) if client_cap else {}
    caps = sorted(((str(names.get(owner_id, owner_id)), held.get(owner_id, (0, client_cap))[0],
                    client_cap, n) for owner_id, n in per_owner.items()),
                  key=lambda row: (-row[1], row[0])) if client_cap else []
    return Outlook(shown, with_error - sum(n for _, n in shown),
                   retried.filter(error="").count(), budgets, ahead, workers(),
                   caps[:10], client_cap)


def filter_names(filters: QueryDict) -> list[tuple[str, str]]:
    """The filter as an operator reads it: (name, value) with an owner's id
    shown as its username (one query) — `owner=partner-x`, not `owner=6`."""
    pairs = [(k, v) for k, values in filters.lists() for v in values]
    ids = [v for k, v in pairs if k == "owner" and v.isascii() and v.isdigit() and len(v) < 19]
    users = get_user_model()
    names = ({str(pk): name for pk, name in users.objects.filter(pk__in=ids)
              .values_list("pk", users.USERNAME_FIELD)} if ids else {})
    return [(k, names.get(v, v) if k == "owner" else v) for k, v in pairs]


def job_load(token: str, user) -> Job:
    """The job `token` names, if it is intact, recent and `user`'s; PermissionDenied otherwise."""
    try:
        data = signing.loads(token, salt=JOB_SALT, max_age=JOB_MAX_AGE)
    except signing.BadSignature:
        raise PermissionDenied("This bulk job is unknown or has expired; start again from "
                               "the task list") from None
    if data.get("u") != user.pk or data.get("a") not in ACTIONS:
        raise PermissionDenied("This bulk job was started by another user")
    return Job(ACTIONS[data["a"]], QueryDict(data["f"]), data["r"],
               parse_datetime(data["c"]), data["u"], data["n"])  # type: ignore[arg-type]  # signed by us


def job_scope(model_admin, request, job: Job):
    """The tasks a job may touch: its filters, created before it was confirmed."""
    return filtered_tasks(model_admin, request, job.filters).filter(created_at__lte=job.cutoff)


def _parse_cursor(cursor: str):
    """(created_at, id) of the last task handled, or None to start from the
    newest. The cursor comes back from the browser, so anything that is not a
    cursor this module wrote counts as none (the chunk then starts again from
    the newest task still to change, which is harmless: the engine refuses
    what no longer applies)."""
    at, _, pk = (cursor or "").partition("|")
    try:
        moment = parse_datetime(at)
        if moment is None or moment.utcoffset() is None or \
                abs(moment.utcoffset()) > MAX_OFFSET:  # type: ignore[arg-type]  # tested above
            return None
        return moment.astimezone(UTC), uuid.UUID(pk)
    except (ValueError, OverflowError):
        return None


@dataclasses.dataclass
class ChunkResult:
    handled: int
    changed: int
    refusals: list  # [(task id, "code: detail")]
    cursor: str     # where the next chunk starts; "" when the job is done


def job_chunk(model_admin, request, job: Job, cursor: str) -> ChunkResult:
    """Apply the job's action to the next CHUNK matching tasks after `cursor`,
    each through the engine; log the changes in Django's admin log."""
    queryset = job_scope(model_admin, request, job).filter(
        state__in=APPLICABLE[transition_of(job.action)])
    after = _parse_cursor(cursor)
    if after is not None:
        at, pk = after
        queryset = queryset.filter(Q(created_at__lt=at) | Q(created_at=at, pk__lt=pk))
    tasks = list(queryset.order_by("-created_at", "-pk")[:CHUNK])
    results = actions_apply(job.action, tasks, user=request.user, reason=job.reason)
    console_action_log(request.user, [r.task for r in results if r.ok],
                       action_message(job.action.label, job.reason, scope="filter-wide"))
    last = tasks[-1] if len(tasks) == CHUNK else None
    return ChunkResult(len(tasks), sum(r.ok for r in results),
                       [(str(r.task_id), r.detail) for r in results if not r.ok],
                       f"{last.created_at.isoformat()}|{last.pk}" if last else "")


def job_now(model_admin, request, job: Job) -> list[dict]:
    """The job's tasks as they are now: per state, a count and the list's URL
    filtered to them. The job's own state filter (usually the very state it
    moved them out of) is left out; its other filters and cut-off stay."""
    scope = job.filters.copy()
    scope.pop("state__exact", None)
    counts = dict(filtered_tasks(model_admin, request, scope).filter(created_at__lte=job.cutoff)
                  .order_by().values_list("state").annotate(n=Count("*")))
    base = reverse("admin:workflows_task_changelist")
    rows = []
    for state in TaskState.values:
        if counts.get(state):
            params = scope.copy()
            params["state__exact"] = state
            rows.append({"state": state, "count": counts[state],
                         "url": f"{base}?{params.urlencode()}"})
    return rows


def new_job(action: OperatorAction, filters: QueryDict, reason: str, user, total: int) -> Job:
    return Job(action, filters, reason, timezone.now(), user.pk, total)
