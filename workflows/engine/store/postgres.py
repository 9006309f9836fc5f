"""The PostgreSQL store: the portable store with its hot verbs as one statement
each, composed in sql.py from named fragments (docs/design.md, "The store").

A claim, a step boundary, a heartbeat and a transition (with its audit row and
step rows) are one round trip each; so is a trigger, new key or plain replay.
Everything else is inherited from OrmStore, which is correct here too; the
contract suite runs both stores on PostgreSQL and holds them to the same rows.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import weakref
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils.dateparse import parse_datetime
from django_fsm import ConcurrentTransition

from workflows.conf import pilot_settings
from workflows.database import in_callers_transaction
from workflows.engine import faults
from workflows.engine.caps import caps_json
from workflows.engine.leases import Lease, Refused
from workflows.engine.store.orm import (
    Claimed,
    OrmStore,
    delivery_owed,
    give_up_after,
    moved,
)
from workflows.engine.store.rows import StepRow
from workflows.engine.store.sql import STATEMENTS, transition_statement
from workflows.models import StepCheckpoint, Task

QUERIES = STATEMENTS

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# Per database connection (psycopg's), the statements already prepared on it.
_PREPARED_ON: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def execute(cursor: Any, sql: str, params: dict[str, Any]) -> None:
    """Run `sql` (named %(x)s parameters) on `cursor` as `EXECUTE <name>(…)` of a
    statement prepared once per database connection.

    These CTEs cost PostgreSQL more to plan than to run (claim_next: ~1 ms of
    planning for ~0.4 ms of execution); a prepared statement is planned once
    per connection. Off (PILOT_PG_PREPARED=false) behind a pooler that does not
    keep sessions (pgbouncer in transaction mode).

    The cache is keyed by the session the cursor is open on, read after the
    cursor was opened: Django's health check (CONN_HEALTH_CHECKS) replaces a
    dead connection inside `connection.cursor()`, so a statement prepared on
    the old session is prepared again on the new one instead of failing once
    ("prepared statement … does not exist") after every reconnect — a
    PostgreSQL restart or failover (docs/operations.md, "High availability")."""
    if not pilot_settings.PILOT_PG_PREPARED:
        cursor.execute(sql, params)
        return
    key, text, names = _numbered(sql)
    done = _PREPARED_ON.setdefault(cursor.connection, set())
    if key not in done:
        cursor.execute(f"PREPARE {key} AS {text}")
        done.add(key)
    if not names:
        cursor.execute(f"EXECUTE {key}")
        return
    cursor.execute(f"EXECUTE {key}({', '.join(['%s'] * len(names))})",
                   [params[n] for n in names])


def _step_arrays(rows: list[StepRow]) -> dict[str, Any]:
    """The `steps` parameter: the rows as one JSON array (jsonb_to_recordset)."""
    return {"steps": json.dumps([
        {"index": r.index, "name": r.name, "state": r.state, "output": r.output,
         "attempts": r.attempts, "compensable": r.compensable,
         "compensation_attempts": r.compensation_attempts, "error": r.error,
         "started_at": r.started_at.isoformat() if r.started_at else None,
         "finished_at": r.finished_at.isoformat() if r.finished_at else None,
         "failures": r.failures}
        for r in rows])}


@functools.lru_cache(maxsize=256)
def _numbered(sql: str) -> tuple[str, str, tuple[str, ...]]:
    """(statement name, `sql` with $1, $2… for its named parameters, their names)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = _PLACEHOLDER.sub(number, sql)
    return "pilot_" + hashlib.sha1(text.encode()).hexdigest()[:20], text, tuple(names)


class PostgresStore(OrmStore):
    name = "postgresql"
    # Replay-log groups per fold, all in one statement: with ~33 rows a group,
    # ~160 ms a pass of the dispatcher's loop (docs/benchmarks.md, make bench-fold).
    fold_batch = 250

    def _run(self, query: str, params: dict[str, Any]) -> Any:
        with connection.cursor() as cursor:
            execute(cursor, QUERIES[query], params)
            return cursor.fetchone()

    def _row(self, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """The statement's one row as {column: value}, None when it returned none."""
        with connection.cursor() as cursor:
            execute(cursor, sql, params)
            row = cursor.fetchone()
            return None if row is None else dict(
                zip([c.name for c in cursor.description], row, strict=True))

    def db_now(self) -> datetime:
        return self._run("db_now", {})[0]

    @in_callers_transaction
    def delete_tasks_in_tx(self, task_ids: list[Any]) -> int:
        """OrmStore.delete_tasks_in_tx in one statement after the deliveries
        (sql.py, "delete_tasks")."""
        if not task_ids:
            return 0
        self.deliveries.outlive_in_tx(task_ids)  # before the steps go: a body may need them
        return self._run("delete_tasks", {"ids": list(task_ids)})[0]

    # --- claims ------------------------------------------------------------------------------

    def _claimed(self, query: str, params: dict[str, Any], name: str) -> Claimed | None:
        values = self._row(QUERIES[query], params)
        if values is None:
            return None
        task = _task_from(values)
        return Claimed(task, values["pilot_db_now"], values["pilot_enqueued_at"],
                       params["worker"],
                       moved=moved(task, name, values["pilot_from_state"], params["actor"]))

    def claim(self, task_id: Any, *, worker: str, lease: timedelta) -> Claimed | None:
        return self._claimed("claim", {"task_id": task_id, "worker": worker[:200],
                                       "actor": f"worker:{worker}"[:200],
                                       "lease_seconds": lease.total_seconds(),
                                       "caps": caps_json()}, "claim")

    def resume(self, task_id: Any, *, worker: str, lease: timedelta,
               after_cancel_of: int | None = None) -> Claimed | None:
        params = {"task_id": task_id, "worker": worker[:200], "actor": f"worker:{worker}"[:200],
                  "lease_seconds": lease.total_seconds(), "token": after_cancel_of}
        query = "resume" if after_cancel_of is None else "resume_after_cancel"
        if after_cancel_of is None:
            params["caps"] = caps_json()
        return self._claimed(query, params, "resume")

    # --- fenced writes -------------------------------------------------------------------------

    def refusal(self, lease: Lease) -> Refused:
        row = self._run("task_version", {"task_id": lease.task_id})
        return Refused(lease, *(row or (None, None)))

    def write_steps(self, lease: Lease, rows: list[StepRow], *,
                    renew_for: timedelta | None = None) -> None:
        params = {"task_id": lease.task_id, "token": lease.token, **_step_arrays(rows)}
        if renew_for is not None:
            params["lease_seconds"] = renew_for.total_seconds()
        [fenced] = self._run("write_steps" if renew_for is None else "write_steps_renew",
                             params)
        if not fenced:
            raise self.refusal(lease)
        if renew_for is not None:
            lease.clock.mark()

    def renew(self, lease: Lease, *, lease_length: timedelta) -> None:
        if self._run("renew", {"task_id": lease.task_id, "token": lease.token,
                               "lease_seconds": lease_length.total_seconds()}) is None:
            raise self.refusal(lease)
        lease.clock.mark()

    def check(self, lease: Lease) -> None:
        if self._run("check", {"task_id": lease.task_id, "token": lease.token}) is None:
            raise self.refusal(lease)

    def save_progress(self, lease: Lease, *, index: int, progress: Any) -> None:
        [fenced] = self._run("save_progress", {"task_id": lease.task_id, "token": lease.token,
                                               "index": index, "progress": json.dumps(progress)})
        if not fenced:
            raise self.refusal(lease)

    # --- the replay log ---------------------------------------------------------------------

    def fold_replays(self, *, since: datetime | None, batch: int) -> tuple[int, int, int]:
        """The batch in one statement and one transaction (sql.py
        `fold_replays`); not prepared: it runs once a minute, and planned with
        its own `since` it reads the last hours through pilot_replay_at_idx and the
        whole log in (task, hour) order."""
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(QUERIES["fold_replays"],
                           {"since": since or "-infinity", "batch": batch})
            folded, removed, found = cursor.fetchone()
            if folded:
                faults.fault_point("before_fold_commit")
        return folded, removed, found

    # --- transitions ---------------------------------------------------------------------------

    def _persist(self, task: Task, token: int, changed: list[str], name: str, from_state: str,
                 actor: str, reason: str, at: datetime, steps: list[StepRow],
                 then_claim_for: tuple[str, timedelta] | None = None) -> Claimed | None:
        """One statement (sql.transition_statement): the transition's diff where
        the task still carries `token`, its audit row, `steps`, and — for the
        ending of a task with an endpoint — its webhook's outbox row, together;
        asked `then_claim_for`, also the claim of the next due task."""
        fields = {f.attname: f for f in Task._meta.concrete_fields}
        params = {f"v{i}": fields[a].get_db_prep_save(task.__dict__[a], connection)
                  for i, a in enumerate(changed)}
        sets = ", ".join(f'"{fields[a].column}" = %(v{i})s' for i, a in enumerate(changed))
        deliver = delivery_owed(task)
        params.update(task_id=task.pk, token=token, transition=name, from_state=from_state,
                      to_state=task.state, actor=actor[:200], reason=reason, at=at,
                      deliver=deliver, restarts=task.restarts if deliver else 0,
                      callback_url=task.callback_url if deliver else "",
                      give_up_seconds=give_up_after().total_seconds())
        if steps:
            params.update(_step_arrays(steps))
        if steps and then_claim_for is not None:
            worker, lease = then_claim_for
            params.update(worker=worker[:200], claim_actor=f"worker:{worker}"[:200],
                          lease_seconds=lease.total_seconds(), caps=caps_json())
            return self._persist_then_claim(
                transition_statement(sets, with_steps=True, then_claim=True), params, task, token,
                worker)
        if self._row(transition_statement(sets, with_steps=bool(steps), then_claim=False),
                     params) is None:
            raise ConcurrentTransition(f"task {task.pk} is no longer at version {token}")
        if then_claim_for is None:
            return None
        worker, lease = then_claim_for
        return self.claim_next(worker=worker, lease=lease)

    def claim_next(self, *, worker: str, lease: timedelta) -> Claimed | None:
        return self._claimed("claim_next", {"worker": worker[:200],
                                            "actor": f"worker:{worker}"[:200],
                                            "lease_seconds": lease.total_seconds(),
                                            "caps": caps_json(), "task_id": None}, "claim")

    def _persist_then_claim(self, sql: str, params: dict[str, Any], task: Task, token: int,
                            worker: str) -> Claimed | None:
        values = self._row(sql, params)
        assert values is not None  # one row always (a LEFT JOIN on one)
        if values["pilot_audit"] is None:
            raise ConcurrentTransition(f"task {task.pk} is no longer at version {token}")
        if values["id"] is None:
            return None
        following = _task_from(values)
        return Claimed(following, values["pilot_db_now"], values["pilot_enqueued_at"], worker,
                       moved=moved(following, "claim", values["pilot_from_state"],
                                   params["claim_actor"]))

    # --- triggers ---------------------------------------------------------------------------

    def create_or_replay(self, task: Task) -> tuple[str, Task] | None:
        """("created", task) when `task` (a new pending task, not saved) was
        inserted (with its owner's default endpoint when it has no callback_url);
        ("replayed", stored task with its steps) when the same request was
        replayed; None when the general path must decide (expired key, a
        failed task to restart, cancelled, a different request, a row another
        transaction is still inserting). One statement either way."""
        params = {"id": task.pk, "owner_id": task.owner_id, "key": task.idempotency_key,
                  "workflow": task.workflow, "payload": json.dumps(task.payload),
                  "fingerprint": task.fingerprint, "max_attempts": task.max_attempts,
                  "source": task.source, "trace_id": task.trace_id,
                  "traceparent": task.traceparent, "callback_url": task.callback_url,
                  "idempotency_ttl": task.idempotency_ttl, "priority": task.priority,
                  "version": task.version, "parent_id": task.parent_id,
                  "parent_step": task.parent_step, "parent_index": task.parent_index}
        values = self._row(QUERIES["create_or_replay"], params)
        assert values is not None  # one row always (a LEFT JOIN on one)
        if values["pilot_created_at"] is not None:
            task.created_at = task.updated_at = task.enqueued_at = values["pilot_created_at"]
            task.pilot_replays, task.pilot_last_replayed_at = 0, None
            task.callback_url = values["pilot_created_callback_url"]
            return "created", task
        if values["id"] is None:
            return None
        row = _task_from(values)
        row.pilot_replays = values["pilot_replays"]
        row.pilot_last_replayed_at = values["pilot_last_replayed_at"]
        # what prefetch_related("steps") would leave: task.steps.all() reads no more
        row._prefetched_objects_cache = {  # type: ignore[attr-defined]
            "steps": _steps(row.pk, values["pilot_steps"])}
        return "replayed", row


def _task_from(values: dict[str, Any]) -> Task:
    """A Task from a row of raw column values, converted as the ORM would
    (JSON columns arrive as text)."""
    fields = Task._meta.concrete_fields
    converted = []
    for field in fields:
        value = values[field.column]
        if hasattr(field, "from_db_value"):
            value = field.from_db_value(value, None, connection)
        converted.append(value)
    return Task.from_db(connection.alias, [f.attname for f in fields], converted)


def _steps(task_id: Any, raw: Any) -> list[StepCheckpoint]:
    if raw is None:
        return []
    items = json.loads(raw) if isinstance(raw, str) else raw
    return [StepCheckpoint(task_id=task_id, index=i["index"], name=i["name"], state=i["state"],
                           attempts=i["attempts"], output=i["output"], error=i["error"],
                           started_at=i["started_at"] and parse_datetime(i["started_at"]),
                           finished_at=i["finished_at"] and parse_datetime(i["finished_at"]))
            for i in items]


__all__ = ["QUERIES", "PostgresStore"]
