"""Reads for the Workers & queue panel: django-q2's clusters, the broker's
queue, and what PILOT's tasks are waiting for. Nothing here writes.

- Clusters come from django-q2's own status records (`Stat`): every cluster
  saves one every guard cycle (0.5 s) with a 3 s expiry, so the ones present
  are the ones alive. With the Redis broker they live in Redis; with the ORM
  broker in the `djangoq` cache, which pilot/settings.py makes the shared
  database cache so that this web process can read what the workers wrote.
  The ORM case is read here with one `get_many` and no write, where
  `Stat.get_all()` would also rewrite its key list on every read.
- A worker is busy when a task's lease names it: the lease owner is
  `<host>:<pid>` of the worker process that claimed it (engine/leases.py).
- The queue: the ORM broker's `OrmQ` rows (waiting = lock in the past; a
  delivered message is locked until django-q2's `retry` passes) or the Redis
  list `django_q:<cluster name>:q`.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime

from django.contrib.auth import get_user_model
from django.core.cache import caches
from django.db.models import Count, F, Min, OuterRef, Q, Subquery
from django_q.conf import Conf
from django_q.signing import BadSignature, SignedPackage

from workflows.conf import pilot_settings
from workflows.engine import broker, client_shares, uses_orm_broker
from workflows.models import StepCheckpoint, Task
from workflows.observability.events import Event, emit
from workflows.rules.states import LEASED_STATES, StepState, TaskState

# Redis: how many messages at the head of the list are decoded to find the
# oldest (front-pushed retries sit before the oldest new trigger).
SAMPLE = 200
MAX_RUNNING_SHOWN = 200


@dataclasses.dataclass(frozen=True)
class RunningStep:
    name: str
    started_at: datetime | None


@dataclasses.dataclass
class WorkerRow:
    pid: int
    tasks: list  # the Task rows this worker holds a lease on (running or cancelling)

    @property
    def busy(self) -> bool:
        return bool(self.tasks)


@dataclasses.dataclass
class ClusterRow:
    name: str
    host: str
    pid: int
    status: str
    started_at: datetime | None
    reported_at: datetime | None
    reincarnations: int
    prefetched: int  # messages taken from the broker, not yet given to a worker
    workers: list[WorkerRow]

    @property
    def busy(self) -> int:
        return sum(w.busy for w in self.workers)


@dataclasses.dataclass
class QueueState:
    broker: str                     # "ORM (database)" or "Redis"
    key: str
    waiting: int | None             # messages not yet delivered
    in_flight: int | None           # ORM only: delivered, locked until acknowledged
    oldest_enqueued_at: datetime | None
    error: str = ""


@dataclasses.dataclass(frozen=True)
class ClientShare:
    """One client's share of the workers (engine/caps.py): `held` of `cap`
    (0: no cap) in its cap group — the client-wide one (`workflow` "") or a
    workflow's own `max_running` — and its due tasks waiting for a slot."""

    client: str
    owner_id: object
    workflow: str
    held: int
    cap: int
    waiting: int

    @property
    def at_cap(self) -> bool:
        return bool(self.cap) and self.held >= self.cap


@dataclasses.dataclass(frozen=True)
class Stuck:
    """A running or cancelling task nobody is moving: its lease ran out, or
    the worker its lease names is in no live cluster's report (it died; the
    dispatcher recovers the task once the lease runs out)."""

    task: Task
    lease_expired: bool
    worker_gone: bool

    @property
    def text(self) -> str:
        parts = []
        if self.worker_gone:
            parts.append("its worker is in no live cluster's report")
        if self.lease_expired:
            parts.append("its lease ran out")
        return " and ".join(parts)


def tasks_stuck(now: datetime, running: list, reported: set[str] | None) -> list[Stuck]:
    """The one rule both the dashboard and Workers & queue apply (docs/console.md,
    "Stuck tasks"): a leased task (`running`: running, compensating or
    cancelling rows) is stuck when its lease expired before `now` (a database
    time) or when its lease owner is not among the `reported` workers
    (`<host>:<pid>`; None when the clusters' status cannot be read — then only
    the lease decides). Longest overdue first, then oldest started."""
    stuck = []
    for task in running:
        expired = task.lease_expires_at is not None and task.lease_expires_at < now
        gone = reported is not None and bool(task.lease_owner) and task.lease_owner not in reported
        if expired or gone:
            stuck.append(Stuck(task, expired, gone))
    far = datetime.max.replace(tzinfo=now.tzinfo)
    return sorted(stuck, key=lambda s: (s.task.lease_expires_at or far,
                                        s.task.started_at or far))


@dataclasses.dataclass
class WorkStatus:
    clusters: list[ClusterRow]
    queue: QueueState
    pending: int
    oldest_pending_at: datetime | None
    due_retries: int
    in_backoff: int
    running: list          # Task rows running or cancelling, with .current_step
    stuck: list            # Stuck: tasks_stuck's answer
    stats_error: str = ""
    shares: list = dataclasses.field(default_factory=list)  # ClientShare, most held first
    client_cap: int = 0    # PILOT_MAX_RUNNING_PER_CLIENT (0: none)

    @property
    def orphans(self) -> list:
        """Running tasks whose lease owner no live cluster reports."""
        return [s.task for s in self.stuck if s.worker_gone]

    @property
    def workers_total(self) -> int:
        return sum(len(c.workers) for c in self.clusters)

    @property
    def workers_busy(self) -> int:
        return sum(c.busy for c in self.clusters)


def _stat_packs() -> list:
    """The signed status records of the live clusters (read only)."""
    if uses_orm_broker():
        cache = caches[Conf.CACHE]
        keys = cache.get(Conf.Q_STAT) or []
        return list(cache.get_many(keys).values()) if keys else []
    return broker().get_stats(f"{Conf.Q_STAT}:*") or []


def cluster_stats() -> tuple[list, str]:
    """([django_q Stat, …], error text): unreadable records are skipped; a
    store that cannot be read is reported, not raised (the panel still shows
    the queue and the tasks)."""
    try:
        packs = _stat_packs()
    except Exception as exc:  # noqa: BLE001 - any cache or Redis failure
        emit(Event.WORKER_STATS_UNAVAILABLE, level=logging.WARNING,
             error=f"{type(exc).__name__}: {exc}"[:300])
        return [], f"cluster status unavailable: {type(exc).__name__}"
    stats = []
    for pack in packs:
        try:
            stats.append(SignedPackage.loads(pack))
        except BadSignature:  # signed with another secret: another installation's
            continue
        except Exception:  # noqa: BLE001,S112 - written by another django-q2 version
            continue
    return stats, ""


def live_workers() -> int | None:
    """How many workers the live clusters report; None when their status
    cannot be read (then nobody can say "no worker")."""
    stats, error = cluster_stats()
    return None if error else sum(len(stat.workers) for stat in stats)


def _oldest_started(packages) -> datetime | None:
    """The earliest send time (`started`) among these messages' packages."""
    oldest = None
    for raw in packages:
        try:
            started = SignedPackage.loads(raw).get("started")
        except Exception:  # noqa: BLE001,S112 - a foreign message: skip it
            continue
        if isinstance(started, datetime) and (oldest is None or started < oldest):
            oldest = started
    return oldest


def queue_state(now: datetime) -> QueueState:
    """Depth and oldest message of this cluster's queue on the broker in use."""
    try:
        if uses_orm_broker():
            from django_q.models import OrmQ

            b = broker()
            queue = OrmQ.objects.using(Conf.ORM).filter(key=b.list_key)
            # `lock` is a fixed past time (enqueue.VISIBLE_AT_ONCE), not the send
            # time: the oldest waiting message (the first in, the ORM broker has
            # no front) says when it was sent in its package.
            rows = queue.aggregate(waiting=Count("pk", filter=Q(lock__lte=now)),
                                   in_flight=Count("pk", filter=Q(lock__gt=now)),
                                   first=Min("pk", filter=Q(lock__lte=now)))
            first = (queue.filter(pk=rows["first"]).values_list("payload", flat=True)
                     if rows["first"] is not None else [])
            return QueueState("ORM (database)", b.list_key, rows["waiting"], rows["in_flight"],
                              _oldest_started(first))
        b = broker()
        depth = b.connection.llen(b.list_key)
        return QueueState("Redis", b.list_key, depth, None,
                          _oldest_started(b.connection.lrange(b.list_key, 0, SAMPLE - 1)))
    except Exception as exc:  # noqa: BLE001 - a broker outage is shown, not raised
        return QueueState("ORM (database)" if uses_orm_broker() else "Redis", "", None, None,
                          None, error=f"{type(exc).__name__}: {exc}"[:200])


def _running_tasks(now: datetime) -> list:
    """Running and cancelling tasks, oldest first, each with `current_step`
    (its running checkpoint's name and start, or None): one query; then, in a
    second (pilot_task_lease_expiry_idx), those past their lease beyond the
    first MAX_RUNNING_SHOWN, so no stuck task hides behind a busy fleet."""
    running = StepCheckpoint.objects.filter(task_id=OuterRef("pk"), state=StepState.RUNNING
                                            ).order_by("-index")
    leased = (Task.objects.select_related("owner").defer("payload", "result", "error")
              .annotate(step_name=Subquery(running.values("name")[:1]),
                        step_started_at=Subquery(running.values("started_at")[:1])))
    tasks = list(leased.filter(state__in=LEASED_STATES)
                 .order_by("started_at", "pk")[:MAX_RUNNING_SHOWN])
    if len(tasks) == MAX_RUNNING_SHOWN:
        seen = {t.pk for t in tasks}
        tasks += [t for t in leased.expired_leases(now).order_by("lease_expires_at")[:20]
                  if t.pk not in seen]
    for task in tasks:
        task.current_step = (RunningStep(task.step_name, task.step_started_at)
                             if task.step_name else None)
    return tasks


def client_share_rows(now: datetime) -> list[ClientShare]:
    """Each client holding workers: held / cap (the engine's own count,
    engine/why.py `client_shares`) and its due tasks waiting; three queries."""
    shares = client_shares()
    if not shares:
        return []
    ids = {owner_id for owner_id, *_ in shares}
    users = get_user_model()
    names = dict(users.objects.filter(pk__in=ids).values_list("pk", users.USERNAME_FIELD))
    due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
    waiting = dict(Task.objects.filter(due, owner_id__in=ids,
                                       state__in=[TaskState.PENDING, TaskState.RETRYING],
                                       attempts__lt=F("max_attempts"))
                   .values("owner_id").annotate(n=Count("pk")).values_list("owner_id", "n"))
    return [ClientShare(str(names.get(owner_id, owner_id)), owner_id, group, held, cap,
                        waiting.get(owner_id, 0) if not group else 0)
            for owner_id, group, held, cap in shares]


def work_status(now: datetime, *, shares: bool = True) -> WorkStatus:
    """Everything the panel shows, in a handful of queries whatever the load;
    without `shares` (the dashboard) the client shares are not read."""
    stats, stats_error = cluster_stats()
    running = _running_tasks(now)
    by_owner: dict[str, list] = {}
    for task in running:
        by_owner.setdefault(task.lease_owner, []).append(task)
    clusters, known = [], set()
    for stat in sorted(stats, key=lambda s: (s.host, str(s.cluster_id))):
        workers = []
        for pid in stat.workers:
            owner = f"{stat.host}:{pid}"
            known.add(owner)
            workers.append(WorkerRow(pid, by_owner.get(owner, [])))
        clusters.append(ClusterRow(
            name=str(getattr(stat, "cluster_id", "")), host=stat.host, pid=stat.pid,
            status=str(stat.status), started_at=getattr(stat, "tob", None),
            reported_at=getattr(stat, "timestamp", None),
            reincarnations=stat.reincarnations, prefetched=stat.task_q_size,
            workers=workers))
    waiting = Task.objects.filter(state__in=[TaskState.PENDING, TaskState.RETRYING]).aggregate(
        pending=Count("pk", filter=Q(state=TaskState.PENDING)),
        oldest=Min("created_at", filter=Q(state=TaskState.PENDING)),
        due=Count("pk", filter=Q(state=TaskState.RETRYING, next_attempt_at__lte=now)),
        backoff=Count("pk", filter=Q(state=TaskState.RETRYING, next_attempt_at__gt=now)))
    return WorkStatus(clusters=clusters, queue=queue_state(now), pending=waiting["pending"],
                      oldest_pending_at=waiting["oldest"], due_retries=waiting["due"],
                      in_backoff=waiting["backoff"], running=running,
                      stuck=tasks_stuck(now, running, None if stats_error else known),
                      stats_error=stats_error,
                      shares=client_share_rows(now) if shares else [],
                      client_cap=int(pilot_settings.PILOT_MAX_RUNNING_PER_CLIENT))
