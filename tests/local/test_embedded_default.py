"""The embedded default with real processes: `run_workers` and `run_dispatcher`
on a SQLite file with the ORM broker and `make run`'s settings (the production
defaults: two workers, the per-client cap, a 60 s lease), running the demos'
atomic steps side by side.

Review turn 3, F2: an atomic step that reads, waits, then writes used to be
refused by SQLite whenever anything committed in between — and under `make run`
something commits every 0.5 s (django-q2's statistics, heartbeats, the other
worker) — so `demo.sync_orders` burned its attempts and `demo.saga` gave up its
compensations. Atomic steps now hold the write lock from BEGIN: every task ends
as its contract says, on its first attempt, and every row is written once."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing

import pytest

from tests.local.conftest import _TEST_ONLY, skip_on_postgres
from tests.support.procs import ROOT

pytestmark = [pytest.mark.slow, skip_on_postgres]

# Heartbeats come every PILOT_HEARTBEAT_SECONDS (5 s by default); inside an
# atomic body a heartbeat is a read of the fence. A step that sleeps longer than
# that therefore reads, waits, then writes: the pattern F2 refused.
LONG = 5.5
SYNC = ([{"batch": "long", "count": 5, "step_seconds": LONG}]
        + [{"batch": f"b{i}", "count": 5, "step_seconds": 0.2} for i in range(3)])
FAILING_SAGAS = [{"fail": True, "compensate_seconds": LONG},
                 {"fail": True, "step_seconds": 0.2, "compensate_seconds": 0.2}]
SAGAS = [{"fail": False, "step_seconds": 0.2} for _ in range(2)]
FLAKY = [{"fail_times": 2} for _ in range(3)]

# Two clients, so that two tasks run at once under the default cap (one per
# client with two workers): the other client's writes commit beside each step.
TRIGGER = """
import json, os
from django.contrib.auth import get_user_model
from workflows.engine import TriggerRequest, task_trigger_many
work = json.loads(os.environ["EMBEDDED_WORK"])
for n, client in enumerate(("alpha", "beta")):
    owner = get_user_model().objects.create_user(client, password="pw-" + client + "-123")
    requests = [TriggerRequest(workflow, payload, f"{workflow}:{i}")
                for i, (workflow, payload, who) in enumerate(work) if who == n]
    task_trigger_many(owner=owner, requests=requests)
"""


def _manage(env, *args, timeout=120):
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True,
                   timeout=timeout)


def test_the_demos_atomic_steps_all_succeed_side_by_side_on_sqlite(tmp_path):
    database = tmp_path / "db.sqlite3"
    env = {k: v for k, v in os.environ.items() if k not in _TEST_ONLY}
    env.update({"DATABASE_URL": f"sqlite:///{database}", "DJANGO_DEBUG": "true",
                "PILOT_DEMO_WORKFLOWS": "true", "PILOT_LOG_FORMAT": "text",
                "PILOT_Q_CLUSTER_NAME": f"embedded-{os.getpid()}", "PYTHONUNBUFFERED": "1"})
    _manage(env, "migrate", "-v0")
    # Client 0 runs the sync_orders, client 1 the sagas (one long step each: they run
    # at the same time), and both some of the rest.
    work = ([("demo.sync_orders", p, 0) for p in SYNC]
            + [("demo.saga", p, 1) for p in FAILING_SAGAS + SAGAS]
            + [("demo.flaky", p, i % 2) for i, p in enumerate(FLAKY)])
    procs = []
    for command in ("run_workers", "run_dispatcher"):
        log = open(tmp_path / f"{command}.log", "wb")  # noqa: SIM115 - handed to the child
        procs.append(subprocess.Popen([sys.executable, "manage.py", command], cwd=ROOT,
                                      env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        log.close()
    try:
        _manage({**env, "EMBEDDED_WORK": json.dumps(work)}, "shell", "-c", TRIGGER)
        with closing(sqlite3.connect(database, timeout=30)) as db:
            deadline = time.monotonic() + 240
            while True:
                unfinished = db.execute("SELECT count(*) FROM workflows_task WHERE state NOT IN "
                                        "('succeeded', 'failed', 'cancelled')").fetchone()[0]
                if not unfinished:
                    break
                assert all(p.poll() is None for p in procs), \
                    (tmp_path / "run_workers.log").read_text()
                assert time.monotonic() < deadline, f"{unfinished} tasks unfinished"
                time.sleep(0.5)
            tasks = db.execute("SELECT id, workflow, payload, state, attempts, error_type "
                               "FROM workflows_task").fetchall()
            assert len(tasks) == len(work)
            for task_id, workflow, raw_payload, state, attempts, error_type in tasks:
                payload = json.loads(raw_payload)
                ledger = sorted(r[0] for r in db.execute(
                    "SELECT action FROM workflows_demoledger WHERE task = ?", [task_id]))
                if workflow == "demo.sync_orders":
                    assert (state, attempts) == ("succeeded", 1), (task_id, error_type)
                    assert db.execute("SELECT count(*) FROM workflows_demoorder WHERE batch = ?",
                                      [payload["batch"]]).fetchone()[0] == 5
                elif workflow == "demo.saga" and payload["fail"]:
                    assert (state, attempts, error_type) == ("failed", 1, "NonRetryableError")
                    assert ledger == ["charge", "refund", "release", "reserve"]
                elif workflow == "demo.saga":
                    assert (state, attempts) == ("succeeded", 1)
                    assert ledger == ["charge", "confirm", "reserve"]
                else:
                    assert (state, attempts) == ("succeeded", 3), (task_id, error_type)
            # Not one step or compensation was refused for the lock on the way.
            assert db.execute("SELECT count(*) FROM workflows_stepcheckpoint "
                              "WHERE error LIKE '%locked%'").fetchone()[0] == 0
            assert db.execute("SELECT count(*) FROM workflows_tasktransition WHERE transition = "
                              "'defer' OR reason LIKE '%locked%'").fetchone()[0] == 0
            # Two tasks really ran at once (the two clients' slots), so their atomic
            # steps and heartbeats interleaved.
            overlaps = db.execute(
                "SELECT count(*) FROM workflows_task a JOIN workflows_task b ON a.id < b.id "
                "AND a.owner_id <> b.owner_id AND a.started_at < b.finished_at "
                "AND b.started_at < a.finished_at").fetchone()[0]
            assert overlaps > 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
