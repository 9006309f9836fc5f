"""Scale-out on PostgreSQL + Redis with real processes (issue 6, SPEC §14).

Two `qcluster` processes (two workers each) and two `run_dispatcher` processes
share one PostgreSQL database and one Redis queue, as two machines would, with
a gunicorn web process exposing the merged metrics of all of them.

1. 500 `demo.sync_orders` tasks: every task succeeds on its first attempt,
   every step runs exactly once, every atomic write lands exactly once, and
   the work is spread over the processes.
2. The same with PostgreSQL crashed and restarted mid-run — on a throwaway
   cluster of this test's own (tests/support/pgcluster.py), never the shared server:
   every task still succeeds, every atomic write still lands exactly once, and
   every process reconnects by itself (none is restarted by the test). During
   the outage the web process answers the scrape endpoint (200 with
   pilot_database_up 0), never a 500.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tests.support.pgcluster import PgCluster
from tests.support.procs import ARTIFACTS, ROOT, Fleet, wait_until
from workflows.engine.triggers import TriggerRequest, task_trigger_many
from workflows.models import DemoOrder, StepCheckpoint, Task, TaskTransition
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow,
              pytest.mark.django_db(transaction=True)]

TASKS, ROWS = 500, 4
STEPS = ("fetch", "transform", "write")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Host": "localhost"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def metric(body: bytes, line_prefix: str) -> float:
    for line in body.decode().splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def start_stack(fleet: Fleet) -> int:
    """Two worker clusters, two dispatchers, one web process; returns its port."""
    port = free_port()
    for _ in range(2):
        fleet.workers()
        fleet.dispatcher()
    web = fleet.start_process("gunicorn", [sys.executable, "-m", "gunicorn", "-c",
                                           "deploy/gunicorn.conf.py", "pilot.wsgi"],
                              PORT=str(port), PILOT_BIND_HOST="127.0.0.1", WEB_CONCURRENCY="1")

    def web_up():
        assert web.alive, web.log()[-2000:]
        try:
            return http_get(port, "/metrics")[0] == 200
        except OSError:
            return False

    wait_until(web_up, 30, what="gunicorn")
    return port


@pytest.fixture
def fleet(tmp_path):
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    # TTL 0: the test reads the task counts right after the run, not 15 s later.
    fleet = Fleet(PROMETHEUS_MULTIPROC_DIR=str(metrics_dir), PILOT_REENQUEUE_SECONDS=10,
                  PILOT_METRICS_TASKS_TTL=0,
                  PILOT_LOG_LEVEL="warning",
                  PILOT_Q_CLUSTER_NAME=f"pilot-multi-{uuid.uuid4().hex[:8]}")
    yield fleet
    fleet.stop_all()


def test_two_nodes_run_500_tasks_each_step_once_each_write_once(owner, fleet):
    port = start_stack(fleet)
    started = time.monotonic()
    requests = [TriggerRequest("demo.sync_orders", {"batch": f"mn-{i}", "count": ROWS},
                               f"mn-{i}") for i in range(TASKS)]
    outcomes = task_trigger_many(owner=owner, requests=requests)
    assert {o.outcome for o in outcomes} == {"created"}

    def finished():
        assert all(p.alive for p in fleet.procs), [p.log()[-2000:] for p in fleet.procs]
        return Task.objects.filter(state__in=[S.SUCCEEDED, S.FAILED, S.CANCELLED]).count() \
            == TASKS

    wait_until(finished, 300, interval=0.5, what="all 500 tasks to finish")
    elapsed = time.monotonic() - started

    assert set(Task.objects.values_list("state", flat=True)) == {S.SUCCEEDED}
    assert set(Task.objects.values_list("attempts", flat=True)) == {1}
    claims = TaskTransition.objects.filter(transition="claim")
    assert claims.count() == TASKS  # one claim per task, whatever the duplicate messages
    steps = StepCheckpoint.objects.all()
    assert steps.count() == TASKS * len(STEPS)
    assert set(steps.values_list("state", "attempts").distinct()) == {("succeeded", 1)}
    per_batch = {}
    for batch in DemoOrder.objects.values_list("batch", flat=True):
        per_batch[batch] = per_batch.get(batch, 0) + 1
    assert per_batch == {f"mn-{i}": ROWS for i in range(TASKS)}
    workers = set(claims.values_list("actor", flat=True))
    assert len(workers) >= 3, workers  # more than one worker process of more than one cluster

    status, body = http_get(port, "/metrics")
    assert status == 200
    wf = 'workflow="demo.sync_orders"'
    assert metric(body, f'pilot_transitions_total{{from="running",to="succeeded",{wf}}}') \
        == TASKS
    for step in STEPS:
        assert metric(body, f'pilot_step_duration_seconds_count{{step="{step}",{wf}}}') == TASKS
    assert metric(body, "pilot_queue_lag_seconds_count") >= TASKS
    assert metric(body, 'pilot_tasks{state="succeeded"}') == TASKS
    (ARTIFACTS / "multi-node.json").write_text(json.dumps(
        {"tasks": TASKS, "seconds": round(elapsed, 1), "worker_processes": len(workers)}))
    print(f"\n{TASKS} tasks on 2 clusters x 2 workers + 2 dispatchers: {elapsed:.1f}s")


# --- with a PostgreSQL crash and restart mid-run ---------------------------------------------

TRIGGER_SCRIPT = """
import json, sys
import django
django.setup()
from django.contrib.auth import get_user_model
from workflows.engine.triggers import TriggerRequest, task_trigger_many
n, rows, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
owner, _ = get_user_model().objects.get_or_create(username="multi-node")
requests = [TriggerRequest("demo.sync_orders",
                           {"batch": f"pr-{i}", "count": rows, "step_seconds": seconds},
                           f"pr-{i}") for i in range(n)]
print(json.dumps(sorted({r.outcome for r in task_trigger_many(owner=owner,
                                                               requests=requests)})))
"""


def check_api_during_outage(port: int) -> list[int]:
    """HTTP answers while the database is down: the scrape still answers (200,
    reporting the database down), readiness and the API answer 503 — never a
    500. Returns [scrape status, pilot_database_up]."""
    status, body = http_get(port, "/metrics")
    assert status == 200, body[:500]
    up = int(metric(body, "pilot_database_up"))
    if up == 0:
        ready, _ = http_get(port, "/readyz")
        assert ready == 503
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("POST", "/api/v1/tasks", body=b'{"workflow": "demo.echo"}',
                         headers={"Authorization": "Token 0123456789abcdef",
                                  "Content-Type": "application/json",
                                  "Idempotency-Key": "outage-probe"})
            answer = conn.getresponse()
            assert answer.status == 503, answer.read()[:500]
            assert answer.getheader("Content-Type") == "application/problem+json"
        finally:
            conn.close()
    return [status, up]


@pytest.fixture
def private_pg():
    with PgCluster() as pg:
        yield pg


def test_a_postgresql_restart_mid_run_loses_nothing_and_processes_reconnect(private_pg,
                                                                            fleet):
    # (private_pg first: the fleet is stopped before the cluster is removed)
    pg = private_pg
    url = pg.create_database("pilot")
    fleet.env["DATABASE_URL"] = url
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, *args], cwd=ROOT, env=fleet.env, capture_output=True, text=True,
        timeout=180)
    migrated = run("manage.py", "migrate", "-v0")
    assert migrated.returncode == 0, migrated.stderr
    assert run("manage.py", "createcachetable").returncode == 0
    port = start_stack(fleet)
    triggered = run("-c", TRIGGER_SCRIPT, str(TASKS), str(ROWS), "0.03")
    assert triggered.returncode == 0 and json.loads(triggered.stdout) == ["created"], \
        triggered.stderr[-3000:]

    def count(state_sql: str) -> int:
        return pg.query("pilot", f"SELECT count(*) FROM workflows_task WHERE {state_sql}")[0][0]

    wait_until(lambda: count("state = 'succeeded'") >= TASKS // 5, 120, interval=0.2,
               what="a fifth of the tasks to finish")
    wait_until(lambda: count("state = 'running'") > 0, 30, interval=0.01,
               what="a task in flight to crash under")
    done_before = count("state = 'succeeded'")
    # What was done when the crash came: these steps must never run again.
    checkpointed = {(task, name): attempts for task, name, attempts in pg.query(
        "pilot", "SELECT task_id, name, attempts FROM workflows_stepcheckpoint "
                 "WHERE state = 'succeeded'")}
    in_flight_before = count("state = 'running'")
    outage_started = time.monotonic()
    pg.stop("immediate")  # a crash: connections cut, no shutdown checkpoint
    during = []
    while time.monotonic() - outage_started < 3:
        during.append(check_api_during_outage(port))
        time.sleep(0.25)
    pg.start()
    [(restarted_at,)] = pg.query("pilot", "SELECT statement_timestamp()")
    outage = time.monotonic() - outage_started
    assert done_before < TASKS and in_flight_before > 0  # the crash came mid-run
    assert [1, 0] == [1, min(up for _, up in during)]  # the scrape saw the database down

    def finished():
        for proc in fleet.procs:
            assert proc.alive, f"{proc.name} died:\n{proc.log()[-3000:]}"
        return count("state IN ('succeeded', 'failed', 'cancelled')") == TASKS

    wait_until(finished, 300, interval=0.5, what="all tasks to finish after the restart")
    states = dict(pg.query("pilot", "SELECT state, count(*) FROM workflows_task GROUP BY 1"))
    assert states == {"succeeded": TASKS}
    wrong = pg.query("pilot", "SELECT batch, count(*) FROM workflows_demoorder GROUP BY 1 "
                              "HAVING count(*) <> %s", (ROWS,))
    assert wrong == []  # every atomic write exactly once
    assert pg.query("pilot", "SELECT count(DISTINCT batch) FROM workflows_demoorder") == \
        [(TASKS,)]
    rerun_steps = pg.query(
        "pilot", "SELECT s.task_id, s.name, s.attempts, t.attempts, "
                 "       (SELECT min(at) FROM workflows_tasktransition c "
                 "         WHERE c.task_id = t.id AND c.transition = 'claim') "
                 "  FROM workflows_stepcheckpoint s JOIN workflows_task t ON t.id = s.task_id "
                 " WHERE s.attempts > 1")
    reruns = len(rerun_steps)
    extra_attempts = pg.query("pilot", "SELECT coalesce(sum(attempts - 1), 0) "
                                       "FROM workflows_task")[0][0]
    # Only work in flight at the crash ran again: no step checkpointed before it, at
    # most the one step each task was in, each in a task claimed before the restart,
    # and each re-run is a further attempt of its task.
    after = {(task, name): attempts for task, name, attempts in pg.query(
        "pilot", "SELECT task_id, name, attempts FROM workflows_stepcheckpoint")}
    assert {k: after[k] for k in checkpointed} == checkpointed
    per_task = {}
    for task_id, name, step_attempts, task_attempts, first_claim in rerun_steps:
        per_task.setdefault(task_id, []).append(name)
        assert first_claim < restarted_at, (task_id, name, first_claim, restarted_at)
        assert step_attempts <= task_attempts, (task_id, name, step_attempts, task_attempts)
    assert [names for names in per_task.values() if len(names) > 1] == []
    assert reruns <= extra_attempts
    assert check_api_during_outage(port) == [200, 1]
    (ARTIFACTS / "multi-node-pg-restart.json").write_text(json.dumps(
        {"tasks": TASKS, "succeeded_before_crash": done_before, "outage_seconds": round(outage, 1),
         "running_at_crash": in_flight_before, "steps_run_again": reruns,
         "extra_task_attempts": int(extra_attempts)}))
    print(f"\nPostgreSQL crash after {done_before}/{TASKS} tasks ({in_flight_before} running), "
          f"down {outage:.1f}s: all "
          f"succeeded; {reruns} step(s) ran again, {extra_attempts} extra attempt(s)")
