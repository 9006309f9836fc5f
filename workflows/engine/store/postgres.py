"""The PostgreSQL store: the portable store with its hot verbs as one statement
each, the literal SQL of queries.sql (docs/design.md, "The store").

A claim, a step boundary, a heartbeat and a transition (with its audit row and
step rows) are one round trip each; a new-key trigger is one statement and a
plain replay one more. Everything else is inherited from OrmStore, which is
correct here too; the contract suite runs both stores on PostgreSQL and holds
them to the same rows.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from django.db import connection
from django.utils.dateparse import parse_datetime
from django_fsm import ConcurrentTransition

from workflows.engine.leases import Lease, Refused
from workflows.engine.store.orm import (
    UPSERT_ON_CONFLICT,
    Claimed,
    OrmStore,
    delivery_owed,
    give_up_after,
)
from workflows.engine.store.rows import StepRow
from workflows.models import StepCheckpoint, Task
from workflows.observability.events import emit_on_commit


def _load(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    name = None
    for line in path.read_text().splitlines():
        if line.startswith("-- name: "):
            name = line.removeprefix("-- name: ").strip()
            queries[name] = ""
        elif name is not None:
            queries[name] += line + "\n"
    queries = {k: v.strip().rstrip(";").replace("{on_conflict}", UPSERT_ON_CONFLICT)
               for k, v in queries.items()}
    deliver = queries.pop("deliver")
    return {k: v.replace("{deliver}", "\n" + deliver) for k, v in queries.items()}


QUERIES = _load(Path(__file__).with_name("queries.sql"))


def _step_arrays(rows: list[StepRow]) -> dict:
    return {
        "index": [r.index for r in rows], "name": [r.name for r in rows],
        "state": [r.state for r in rows],
        "output": [None if r.output is None else json.dumps(r.output) for r in rows],
        "attempts": [r.attempts for r in rows], "compensable": [r.compensable for r in rows],
        "compensation_attempts": [r.compensation_attempts for r in rows],
        "error": [r.error for r in rows], "started_at": [r.started_at for r in rows],
        "finished_at": [r.finished_at for r in rows],
    }


class PostgresStore(OrmStore):
    name = "postgresql"

    def _run(self, query: str, params: dict):
        with connection.cursor() as cursor:
            cursor.execute(QUERIES[query], params)
            return cursor.fetchone()

    def db_now(self):
        return self._run("db_now", {})[0]

    # --- claims ------------------------------------------------------------------------------

    def _claimed(self, query: str, params: dict, name: str) -> Claimed | None:
        rows = list(Task.objects.raw(QUERIES[query], params))
        if not rows:
            return None
        task = rows[0]
        task._update_initial_state()
        emit_on_commit("task_transitioned", task_id=str(task.pk), workflow=task.workflow,
                       transition=name, from_state=task.pilot_from_state, to_state=task.state,
                       attempt=task.attempts, actor=params["actor"],
                       trace_id=task.trace_id or None)
        return Claimed(task, task.pilot_db_now, task.pilot_enqueued_at, params["worker"])

    def claim(self, task_id, *, worker: str, lease: timedelta) -> Claimed | None:
        return self._claimed("claim", {"task_id": task_id, "worker": worker[:200],
                                       "actor": f"worker:{worker}"[:200],
                                       "lease_seconds": lease.total_seconds()}, "claim")

    def resume(self, task_id, *, worker: str, lease: timedelta,
               after_cancel_of: int | None = None) -> Claimed | None:
        params = {"task_id": task_id, "worker": worker[:200], "actor": f"worker:{worker}"[:200],
                  "lease_seconds": lease.total_seconds(), "token": after_cancel_of}
        query = "resume" if after_cancel_of is None else "resume_after_cancel"
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

    def save_progress(self, lease: Lease, *, index: int, progress) -> None:
        [fenced] = self._run("save_progress", {"task_id": lease.task_id, "token": lease.token,
                                               "index": index, "progress": json.dumps(progress)})
        if not fenced:
            raise self.refusal(lease)

    # --- transitions ---------------------------------------------------------------------------

    def _persist(self, task, token, changed, name, from_state, actor, reason, at, steps):
        """One statement (queries.sql `transition`): the transition's diff where
        the task still carries `token`, its audit row, `steps`, and — for the
        ending of a task with an endpoint — its webhook's outbox row, together."""
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
        query = "transition"
        if steps:
            query = "transition_with_steps"
            params.update(_step_arrays(steps))
        with connection.cursor() as cursor:
            cursor.execute(QUERIES[query].replace("{sets}", sets), params)
            if cursor.fetchone() is None:
                raise ConcurrentTransition(f"task {task.pk} is no longer at version {token}")

    # --- triggers ---------------------------------------------------------------------------

    def create_or_replay(self, task: Task):
        """("created", task) when `task` (a new pending task, not saved) was
        inserted (with its owner's default endpoint when it has no callback_url);
        ("replayed", stored task with its steps) when the same request was
        replayed; None when the general path must decide (expired key, a
        failed task to restart, cancelled, a different request, a row another
        transaction is still inserting). One statement for a new key, two for a
        replay."""
        params = {"id": task.pk, "owner_id": task.owner_id, "key": task.idempotency_key,
                  "workflow": task.workflow, "payload": json.dumps(task.payload),
                  "fingerprint": task.fingerprint, "max_attempts": task.max_attempts,
                  "source": task.source, "trace_id": task.trace_id,
                  "traceparent": task.traceparent, "callback_url": task.callback_url}
        created = self._run("create_task", params)
        if created is not None:
            task.created_at = task.updated_at = task.enqueued_at = created[0]
            task.callback_url = created[1]
            return "created", task
        rows = list(Task.objects.raw(QUERIES["replay"], params))
        if not rows:
            return None
        row = rows[0]
        row._prefetched_objects_cache = {"steps": _steps(row.pk, row.pilot_steps)}
        return "replayed", row


def _steps(task_id, raw) -> list[StepCheckpoint]:
    if raw is None:
        return []
    items = json.loads(raw) if isinstance(raw, str) else raw
    return [StepCheckpoint(task_id=task_id, index=i["index"], name=i["name"], state=i["state"],
                           attempts=i["attempts"], output=i["output"], error=i["error"],
                           started_at=i["started_at"] and parse_datetime(i["started_at"]),
                           finished_at=i["finished_at"] and parse_datetime(i["finished_at"]))
            for i in items]


__all__ = ["QUERIES", "PostgresStore"]
