"""The invariant checker every fault scenario ends with — and may run while the
system still runs (`require_terminal=False`).

It reads only the database (and what the scenario's clients recorded) and
returns the list of violations, so a scenario asserts `violations == []` and a
failure names every broken promise at once. Everything is read in one snapshot
(REPEATABLE READ on PostgreSQL), so a check made mid-run sees a consistent state:
no invariant here may rely on the system being quiet.

Only promises the database does not enforce by itself are checked (one task per
key and attempts <= max_attempts are constraints; asserting them could not fail):

- every acknowledged trigger's task exists; nothing is left unfinished (at the end);
- no task runs on a lease that expired long ago, by the database's clock (live);
- the audit trail is a chain of legal edges ending in the task's state;
- one `claim` per counted attempt, and no step ran more often than its task was
  claimed;
- the steps agree with the trail: a succeeded task has only succeeded steps, a
  finished one no step still running or compensating, compensation states only
  after a `compensate` or `cancel`, a compensated step was compensable and tried;
- no step succeeded after its task's terminal transition (a fenced-out worker's
  late write);
- effects: demo.sync_orders' rows, demo.saga's and demo.crash's ledger rows,
  exactly once per checkpoint that says the (atomic) effect happened, never
  otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter, defaultdict
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count

from workflows.engine.store import store
from workflows.models import DemoLedger, DemoOrder, StepCheckpoint, Task, TaskTransition
from workflows.rules.states import FINISHED_STATES
from workflows.rules.states import TaskState as S

# Every edge of the state machine (docs/design.md), as (transition, from, to).
LEGAL_EDGES = {
    ("claim", S.PENDING, S.RUNNING), ("claim", S.RETRYING, S.RUNNING),
    ("succeed", S.RUNNING, S.SUCCEEDED),
    ("schedule_retry", S.RUNNING, S.RETRYING), ("recover", S.RUNNING, S.RETRYING),
    ("compensate", S.RUNNING, S.COMPENSATING),
    ("fail", S.RUNNING, S.FAILED), ("fail", S.COMPENSATING, S.FAILED),
    ("resume", S.COMPENSATING, S.COMPENSATING), ("resume", S.CANCELLING, S.CANCELLING),
    ("defer", S.COMPENSATING, S.COMPENSATING), ("defer", S.CANCELLING, S.CANCELLING),
    ("cancel", S.PENDING, S.CANCELLED), ("cancel", S.RETRYING, S.CANCELLED),
    ("cancel", S.PENDING, S.CANCELLING), ("cancel", S.RETRYING, S.CANCELLING),
    ("cancel", S.RUNNING, S.CANCELLING),
    ("finish_cancel", S.CANCELLING, S.CANCELLED),
    ("retry", S.FAILED, S.PENDING), ("retry", S.CANCELLED, S.PENDING),
    ("park", S.RUNNING, S.WAITING), ("wake", S.WAITING, S.PENDING),
    ("release", S.RUNNING, S.PENDING),
    ("cancel", S.WAITING, S.CANCELLED), ("cancel", S.WAITING, S.CANCELLING),
}


@dataclasses.dataclass
class Observed:
    """What the clients of a scenario saw."""

    acknowledged: dict = dataclasses.field(default_factory=dict)  # (owner_id, key) -> task id
    server_errors: list = dataclasses.field(default_factory=list)  # 5xx outside fault windows
    foreign_reads: list = dataclasses.field(default_factory=list)  # another client's data seen
    wrong_answers: list = dataclasses.field(default_factory=list)  # e.g. a reused key accepted


@contextlib.contextmanager
def snapshot():
    """One consistent read of everything the checks look at (inside a caller's
    transaction, that transaction's view)."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def violations(observed: Observed | None = None, *, require_terminal: bool = True,
               tasks=None, lease_grace: float | None = None) -> list[str]:
    """Every broken promise, read in one snapshot. `require_terminal=False`: the
    checks that hold at any moment (to run while the system runs). A running
    task's lease may be expired by at most `lease_grace` seconds (default: the
    dispatcher's poll interval + 10 s) before it counts as abandoned."""
    observed = observed or Observed()
    with snapshot():
        return _violations(observed, require_terminal,
                           tasks if tasks is not None else Task.objects.all(), lease_grace)


def _violations(observed, require_terminal, tasks, lease_grace) -> list[str]:
    found: list[str] = []
    ids = {str(pk) for pk in tasks.values_list("pk", flat=True)}
    for (_owner_id, key), task_id in observed.acknowledged.items():
        if str(task_id) not in ids:
            found.append(f"acknowledged task {task_id} for key {key!r} is missing")

    if require_terminal:
        stuck = tasks.exclude(state__in=FINISHED_STATES).values_list("pk", "state")
        found += [f"task {pk} is still {state}" for pk, state in stuck]

    grace = (settings.PILOT_DISPATCHER_POLL_SECONDS + 10) if lease_grace is None else lease_grace
    late = store().db_now() - timedelta(seconds=grace)
    overdue = tasks.filter(state=S.RUNNING, lease_expires_at__lt=late).values_list("pk",
                                                                                   flat=True)
    found += [f"task {pk} is running on a lease that expired more than {grace:g} s ago"
              for pk in overdue]
    leased = (tasks.filter(state=S.WAITING).exclude(lease_owner="", lease_expires_at=None)
              .values_list("pk", flat=True))
    found += [f"task {pk} is waiting but holds a lease" for pk in leased]

    current = {pk: (state, attempts, restarts) for pk, state, attempts, restarts in
               tasks.values_list("pk", "state", "attempts", "restarts")}
    chains = defaultdict(list)
    for row in (TaskTransition.objects.filter(task_id__in=list(current)).order_by("task_id", "id")
                .values_list("task_id", "transition", "from_state", "to_state", "at")):
        chains[row[0]].append(row[1:])
    steps = defaultdict(list)
    for row in (StepCheckpoint.objects.filter(task_id__in=list(current))
                .values_list("task_id", "name", "state", "attempts", "compensable",
                             "compensation_attempts", "finished_at")):
        steps[row[0]].append(row[1:])

    found += _audit_chains(current, chains)
    found += _attempts(current, chains, steps)
    found += _steps_agree_with_the_trail(current, chains, steps)
    found += _nothing_after_the_end(current, chains, steps)
    found += _atomic_effects(tasks)
    found += _ledger(tasks, steps)
    found += [f"5xx outside a fault window: {e}" for e in observed.server_errors]
    found += [f"foreign read: {e}" for e in observed.foreign_reads]
    found += [f"wrong answer: {e}" for e in observed.wrong_answers]
    return found


def _atomic_effects(tasks) -> list[str]:
    """demo.sync_orders writes `count` rows in its atomic last step: exactly
    `count` rows when it succeeded, none otherwise."""
    found = []
    rows = defaultdict(int)
    for batch, n in DemoOrder.objects.values_list("batch").annotate(n=Count("id")):
        rows[batch] = n
    for task in tasks.filter(workflow="demo.sync_orders").only("pk", "state", "payload"):
        expected = task.payload["count"] if task.state == S.SUCCEEDED else 0
        if rows[task.payload["batch"]] != expected:
            found.append(f"batch {task.payload['batch']}: {rows[task.payload['batch']]} rows, "
                         f"expected {expected} (task {task.pk} {task.state})")
    return found


def _audit_chains(current, chains) -> list[str]:
    """Every audit row is a legal edge, each starts where the last ended, and
    the last one ends in the task's current state."""
    found = []
    for task_id, (state, _, _) in current.items():
        at = S.PENDING
        for name, source, target, _ in chains[task_id]:
            if (name, source, target) not in LEGAL_EDGES:
                found.append(f"task {task_id}: illegal edge {name} {source}->{target}")
            if source != at:
                found.append(f"task {task_id}: {name} from {source} but it was {at}")
            at = target
        if at != state:
            found.append(f"task {task_id}: history ends in {at} but the task is {state}")
    return found


def _attempts(current, chains, steps) -> list[str]:
    """Each attempt is one claim (a recover, a retry, a restart never hands one
    back), and a step runs at most once per attempt."""
    found = []
    for task_id, (_, attempts, _) in current.items():
        claims = sum(1 for name, *_ in chains[task_id] if name == "claim")
        if claims != attempts:
            found.append(f"task {task_id}: {claims} claims but {attempts} attempts counted")
        for name, _, step_attempts, *_ in steps[task_id]:
            if step_attempts > claims:
                found.append(f"task {task_id}: step {name} ran {step_attempts} times in "
                             f"{claims} claims")
    return found


COMPENSATION_STEP_STATES = ("compensating", "compensated", "compensation_failed")


def _steps_agree_with_the_trail(current, chains, steps) -> list[str]:
    found = []
    for task_id, (state, _, _) in current.items():
        names = {name for name, *_ in chains[task_id]}
        for name, step_state, _, compensable, comp_attempts, _ in steps[task_id]:
            if state == S.SUCCEEDED and step_state != "succeeded":
                found.append(f"task {task_id} succeeded with step {name} {step_state}")
            if state in FINISHED_STATES and step_state in ("running", "compensating"):
                found.append(f"task {task_id} is {state} with step {name} still {step_state}")
            if step_state in COMPENSATION_STEP_STATES and not names & {"compensate", "cancel"}:
                found.append(f"task {task_id}: step {name} {step_state} without a compensate "
                             "or cancel in its history")
            if step_state == "compensated" and not (compensable and comp_attempts >= 1):
                found.append(f"task {task_id}: step {name} compensated but compensable="
                             f"{compensable}, compensation attempts {comp_attempts}")
        if state == S.SUCCEEDED and not steps[task_id]:
            found.append(f"task {task_id} succeeded without any step")
    return found


def _nothing_after_the_end(current, chains, steps) -> list[str]:
    """While a task is finished, no step of it succeeded after the transition
    that finished it: a write that late came from a worker the fence should
    have refused."""
    found = []
    for task_id, (state, _, _) in current.items():
        if state not in FINISHED_STATES or not chains[task_id]:
            continue
        ended_at = chains[task_id][-1][3]
        for name, step_state, *_, finished_at in steps[task_id]:
            if step_state == "succeeded" and finished_at and finished_at > ended_at:
                found.append(f"task {task_id}: step {name} succeeded at {finished_at}, after "
                             f"the task ended ({state}) at {ended_at}")
    return found


DONE = ("succeeded", "compensating", "compensated", "compensation_failed")
# (workflow, ledger action) -> (the step whose checkpoint records it, the states in
# which that (atomic) effect happened). demo.crash's `unprepare` is a plain
# compensation — at least once — and is not listed.
LEDGER = {
    ("demo.saga", "reserve"): ("reserve", DONE),
    ("demo.saga", "charge"): ("charge", DONE),
    ("demo.saga", "confirm"): ("confirm", ("succeeded",)),
    ("demo.saga", "release"): ("reserve", ("compensated",)),
    ("demo.saga", "refund"): ("charge", ("compensated",)),
    ("demo.crash", "prepare"): ("prepare", DONE),
}


def _ledger(tasks, steps) -> list[str]:
    """Each atomic effect exactly once when its checkpoint says it happened, never
    when it says not (a restarted task: at most once per life)."""
    found = []
    workflows = {w for w, _ in LEDGER}
    subject = dict(tasks.filter(workflow__in=workflows).values_list("pk", "workflow"))
    if not subject:
        return found
    restarts = dict(tasks.filter(pk__in=list(subject)).values_list("pk", "restarts"))
    counts = Counter(DemoLedger.objects.filter(task__in=list(subject))
                     .values_list("task", "action"))
    for task_id, workflow in subject.items():
        states = {name: step_state for name, step_state, *_ in steps[task_id]}
        for (wf, action), (step, happened) in LEDGER.items():
            if wf != workflow:
                continue
            n = counts[(task_id, action)]
            if restarts[task_id]:
                if n > restarts[task_id] + 1:
                    found.append(f"task {task_id}: {n} {action} effects in "
                                 f"{restarts[task_id] + 1} lives")
                continue
            expected = 1 if states.get(step) in happened else 0
            if n != expected:
                found.append(f"task {task_id}: {n} {action} effect(s), expected {expected} "
                             f"(step {step} {states.get(step, 'not started')})")
    return found
