"""Queries per PILOT run, counted in-process (Django's CaptureQueriesContext).

    python -m bench.workloads.queries          (broker and cache from the env)

The server has no pg_stat_statements preloaded and the bench must not restart a
shared server, so the statements are counted where they are issued: an API
trigger (new key, replay) through DRF's test client, a batch, the worker's
`run_task` on a claimed-able task, and — with the ORM broker — django-q2's own
dequeue and acknowledge per message. The counts include BEGIN and COMMIT
(psycopg sends them as statements), so they are database round trips;
`transactions` counts the commits. The statements of one worker run are
written to bench/out/queries-<broker>.txt.
"""

from __future__ import annotations

import re
import statistics
import uuid
from collections import Counter

from bench.common import OUT, emit_result
from bench.workloads import pilotdb

RUNS = 20
DRAINED = 500


class Counted:
    """Statements (CaptureQueriesContext) and commits of the default connection."""

    def __init__(self):
        from django.db import connections
        from django.test.utils import CaptureQueriesContext

        self.connection = connections["default"]
        self.capture = CaptureQueriesContext(self.connection)
        self.commits = 0

    def __enter__(self) -> Counted:
        original = self.connection.commit

        def commit():
            self.commits += 1
            return original()

        self.connection.commit = commit
        self.capture.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.capture.__exit__(*exc)
        del self.connection.commit

    @property
    def statements(self) -> list[str]:
        return [q["sql"] for q in self.capture.captured_queries]


def describe(sql: str) -> str:
    """A statement as its kind and table: 'UPDATE workflows_task'."""
    sql = sql.strip()
    verb = sql.split(None, 1)[0].upper()
    if verb in ("BEGIN", "COMMIT"):
        return verb
    if verb in ("SAVEPOINT", "RELEASE", "ROLLBACK"):
        return f"{verb} (savepoint)"
    pattern = {"SELECT": r'FROM "?(\w+)"?', "INSERT": r'INTO "?(\w+)"?',
               "UPDATE": r'UPDATE "?(\w+)"?', "DELETE": r'FROM "?(\w+)"?'}.get(verb)
    match = re.search(pattern, sql) if pattern else None
    table = match.group(1) if match else "?"
    extra = " FOR UPDATE" if verb == "SELECT" and "FOR UPDATE" in sql else ""
    extra += " ON CONFLICT" if verb == "INSERT" and "ON CONFLICT" in sql else ""
    return f"{verb} {table}{extra}"


def api_trigger_counts(owner, token: str) -> dict:
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    body = {"workflow": "test.noop3", "payload": {"n": 1}}
    key = f"q-{uuid.uuid4().hex}"
    client.post("/api/v1/tasks", body, format="json", HTTP_IDEMPOTENCY_KEY="warm-" + key)
    counts = {}
    for name, status in (("api_new_key", 202), ("api_replay", 200)):
        with Counted() as counted:
            response = client.post("/api/v1/tasks", body, format="json",
                                   HTTP_IDEMPOTENCY_KEY=key)
        assert response.status_code == status, (name, response.status_code, response.content)
        counts[name] = {"statements": len(counted.statements), "transactions": counted.commits,
                        "kinds": dict(Counter(map(describe, counted.statements)))}
    items = [{"idempotency_key": f"{key}-{i}", "workflow": "test.noop3", "payload": {"n": 1}}
             for i in range(100)]
    with Counted() as counted:
        response = client.post("/api/v1/tasks/batch", {"tasks": items}, format="json")
    assert response.status_code == 200, response.content
    counts["api_batch_100"] = {"statements": len(counted.statements),
                               "transactions": counted.commits}
    with Counted() as counted:
        response = client.post("/bench/ceiling", body, format="json",
                               HTTP_IDEMPOTENCY_KEY=f"ceiling-{key}")
    assert response.status_code == 201, response.content
    counts["ceiling"] = {"statements": len(counted.statements), "transactions": counted.commits,
                         "kinds": dict(Counter(map(describe, counted.statements)))}
    return counts


def worker_counts(owner, broker_name: str) -> dict:
    """A worker's statements per run of test.noop3 (claim, three checkpoints,
    success): a lone run (one message, nothing else due: the drain's last
    claim finds nothing and costs one statement), and the steady state of a
    backlog (DRAINED runs drained by one call: each success claims the next
    run in the same statement). PREPARE — once per connection and statement,
    not per run — is counted apart."""
    from workflows.engine.run import task_run
    from workflows.engine.triggers import TriggerRequest, task_trigger_many
    from workflows.models import Task
    from workflows.worker import run_task

    def trigger(n: int) -> list:
        prefix = f"q-{uuid.uuid4().hex[:8]}-"
        return task_trigger_many(owner=owner, requests=[
            TriggerRequest("test.noop3", {"run": i}, f"{prefix}{i}") for i in range(n)])

    statements, commits, prepares, example = [], [], 0, []
    for _ in range(RUNS):
        [outcome] = trigger(1)
        with Counted() as counted:
            assert run_task(str(outcome.task.pk)) == "succeeded"
        run = [q for q in counted.statements if not q.startswith("PREPARE ")]
        prepares += len(counted.statements) - len(run)
        statements.append(len(run))
        commits.append(counted.commits)
        example = run
    outcomes = trigger(DRAINED)
    with Counted() as counted:
        task_run(task_id=outcomes[0].task.pk, worker="bench:queries", drain_seconds=300)
    done = Task.objects.filter(pk__in=[o.task.pk for o in outcomes],
                               state="succeeded").count()
    drained = [q for q in counted.statements if not q.startswith("PREPARE ")]
    path = OUT / f"queries-{broker_name}.txt"
    path.write_text("\n".join(f"{i + 1:2}. {sql}" for i, sql in enumerate(example)) + "\n")
    result = {"statements": statistics.median(statements),
              "transactions": statistics.median(commits),
              "drained_runs": done,
              "drained_per_run": round(len(drained) / done, 2) if done else None,
              "prepares": prepares + len(counted.statements) - len(drained),
              "kinds": dict(Counter(map(describe, example))), "listing": str(path)}
    if broker_name == "orm":
        result["broker_per_message"] = _orm_broker_counts()
    return result


def _orm_broker_counts() -> int:
    """Statements django-q2's ORM broker spends per message: dequeue (select,
    lock update) and acknowledge (delete), outside PILOT's code."""
    from django_q.brokers import get_broker

    broker = get_broker()
    with Counted() as counted:
        [(ack_id, _)] = broker.dequeue()[:1]
        broker.acknowledge(ack_id)
    return len(counted.statements)


def raw_counts() -> dict:
    from bench.ceiling.rawq import write3

    with Counted() as counted:
        write3(f"q-raw-{uuid.uuid4().hex[:8]}")
    return {"statements": len(counted.statements), "transactions": counted.commits}


def main() -> None:
    pilotdb.setup()
    import logging

    from django.conf import settings
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client needs it (and ALLOWED_HOSTS 'testserver')
    logging.getLogger("pilot.events").setLevel(logging.WARNING)
    pilotdb.reset()
    owner = pilotdb.owner()
    broker_name = "redis" if settings.REDIS_URL else "orm"
    OUT.mkdir(exist_ok=True)
    emit_result({"broker": broker_name,
                 "throttle_cache": "redis" if settings.REDIS_URL else "database",
                 **api_trigger_counts(owner, pilotdb.token()),
                 "worker_run": worker_counts(owner, broker_name), "raw_run": raw_counts()})
    pilotdb.reset()


if __name__ == "__main__":
    main()
