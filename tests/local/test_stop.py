"""`make run` stops within PILOT_STOP_SECONDS + 1 s (7 s) of SIGTERM or SIGINT,
from anywhere, whatever the queue holds, and says what it waits for.

Two workers each run a `demo.slow` step of a minute and more such tasks wait
in the queue: a graceful stop of django-q2's cluster would take minutes. The
workers get PILOT_STOP_SECONDS (6 s under `make run`) to finish, are then SIGKILLed (their
tasks resume from their last checkpoint once their leases expire), and every
process `make run` started is gone within 7 s of the signal. A step that ends
within the grace period is recorded and its task released: no next step
starts, and the next run resumes it at once (the last test)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import sqlite3
import time

import pytest

from tests.local.conftest import skip_on_postgres, still_running
from tests.support.procs import ROOT

pytestmark = [pytest.mark.slow, skip_on_postgres]

# PILOT_STOP_SECONDS (6 s under `make run`) + 1 s (docs/operations.md, "Stopping").
BOUND = 7.0


def api(run, method: str, path: str, body: dict | None = None, key: str | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", run.port, timeout=30)
    headers = {"Authorization": f"Token {run.token}", "Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    try:
        conn.request(method, path, body=json.dumps(body) if body else None, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def busy_workers(run) -> list[str]:
    """Four minute-long demo.slow tasks: two run (one per worker), two wait in
    the queue. Returns the ids of the two running ones once both run."""
    ids = []
    for n in range(4):
        status, task = api(run, "POST", "/api/v1/tasks", {
            "workflow": "demo.slow", "payload": {"steps": 2, "seconds": 60}}, key=f"slow-{n}")
        assert status == 202, task
        ids.append(task["id"])
    deadline = time.monotonic() + 30
    while True:
        running = [i for i in ids if api(run, "GET", f"/api/v1/tasks/{i}")[1]["state"]
                   == "running"]
        if len(running) == 2:
            return running
        assert time.monotonic() < deadline, f"two tasks never ran at once:\n{run.log()[-3000:]}"
        time.sleep(0.2)


def stopped_within(run, tree: dict, bound: float, sent: float) -> float:
    """Seconds from `sent` until every process of `tree` exited (fails after `bound`)."""
    while still_running(tree):
        if time.monotonic() - sent > bound:
            pytest.fail(f"still running {bound} s after the signal: {still_running(tree)}\n"
                        f"{run.log()[-4000:]}")
        time.sleep(0.05)
    took = time.monotonic() - sent
    run.popen.wait(1)  # exited already (a zombie until reaped)
    return took


def assert_said_what_it_waited_for(log: str, running: list[str]) -> None:
    said = re.search(r"waiting for the workers to finish tasks (.*) \(up to 6 s\)", log)
    assert said, log[-4000:]
    for task_id in running:
        assert f"{task_id} (demo.slow, step s0)" in said.group(1)
    assert ("workers had not stopped after 6 s: ended them (SIGKILL); what they were "
            "running resumes from its last checkpoint") in log
    assert re.search(r"stopped in \d+\.\d s", log)


def test_sigterm_stops_make_run_within_7_s_with_tasks_in_flight(local_run):
    run = local_run()
    running = busy_workers(run)
    tree = run.tree()
    assert len(tree) >= 10  # run-local, gunicorn and 2 workers, run_workers, qcluster's 6, ...
    sent = time.monotonic()
    os.kill(run.popen.pid, signal.SIGTERM)
    took = stopped_within(run, tree, BOUND, sent)
    log = run.log()
    assert ("SIGTERM: stopping; waiting for the workers, the dispatcher and the web server "
            "to stop") in log
    assert_said_what_it_waited_for(log, running)
    assert run.popen.returncode == 0
    assert took > 5  # it did give the running steps their time (6 s)


def test_sigint_to_make_stops_everything_within_7_s(local_run):
    """`kill -INT <make's pid>`: make neither passes it on to its recipe nor
    exits while the recipe runs. (Ctrl-C in the terminal, which signals the
    whole foreground group, is the last test here.)"""
    run = local_run(via_make=True)
    running = busy_workers(run)
    tree = run.tree()
    sent = time.monotonic()
    os.kill(run.popen.pid, signal.SIGINT)
    stopped_within(run, tree, BOUND, sent)
    log = run.log()
    assert "\nSIGINT to make: stopping; waiting for the workers" in log
    assert_said_what_it_waited_for(log, running)
    assert run.popen.returncode == -signal.SIGINT  # make re-raises it once its recipe ended


def test_a_sigkilled_run_local_leaves_nothing_running(local_run):
    """Its children get SIGTERM when it dies (PR_SET_PDEATHSIG) and stop by
    themselves, within their own bounds."""
    run = local_run()
    tree = run.tree()
    os.kill(run.popen.pid, signal.SIGKILL)
    stopped_within(run, tree, BOUND, time.monotonic())
    assert "pilot.workers: SIGTERM: stopping the workers" in run.log()


def rows(database, sql: str, *args) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(database)) as db:
        return db.execute(sql, args).fetchall()


def task_row(run, task_id: str) -> tuple:
    return rows(run.database, "SELECT state, lease_owner, lease_expires_at, attempts FROM "
                "workflows_task WHERE id = ?", task_id.replace("-", ""))[0]


def audit(run, task_id: str) -> list[tuple]:
    return rows(run.database, "SELECT transition, reason FROM workflows_tasktransition "
                "WHERE task_id = ? ORDER BY id", task_id.replace("-", ""))


def checkpoints(run, task_id: str) -> list[tuple]:
    return rows(run.database, "SELECT name, state, attempts FROM workflows_stepcheckpoint "
                "WHERE task_id = ? ORDER BY \"index\"", task_id.replace("-", ""))


def readme_banner(port: int) -> re.Pattern:
    """The banner README.md's quickstart shows, as a pattern: its values are
    any, its lines and their order exactly those make run prints."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Its start-up ends with:\n\n```\n(.*?)```", readme, re.S).group(1)
    pattern = re.escape(block.replace("8000", str(port)))
    for value in ("Cu4Ha1wabIpzyJeS", "pilot_55573bfe_mehocYMvFaCe77pRw3Tn3J6xZ744nUJcsvv_6FY9OjQ",
                  "db.sqlite3-credentials"):
        pattern = pattern.replace(re.escape(value), r"\S+")
    return re.compile(pattern)


def test_ctrl_c_mid_step_starts_no_next_step_exits_in_bound_and_the_restart_resumes_at_once(
        local_run):
    """The stop keeps its word (review 3, ux.md §2 #2-3, §3): after Ctrl-C in
    the middle of s0 the worker finishes s0, records it, releases the task and
    starts no s1; the shell prompt is back within PILOT_STOP_SECONDS + 1 s. The
    next `make run` resumes at s1 at once (no lease to wait out), with the same
    admin password and token (9b)."""
    run = local_run(via_make=True)
    assert readme_banner(run.port).search(run.log()), run.log()[-3000:]  # row 18
    status, task = api(run, "POST", "/api/v1/tasks", {
        "workflow": "demo.slow", "payload": {"steps": 2, "seconds": 2}}, key="stop-resume")
    assert status == 202, task
    deadline = time.monotonic() + 30
    while checkpoints(run, task["id"]) != [("s0", "running", 1)]:
        assert time.monotonic() < deadline, run.log()[-3000:]
        time.sleep(0.05)
    time.sleep(0.3)  # inside s0's two seconds
    tree = run.tree()
    sent = time.monotonic()
    os.killpg(run.popen.pid, signal.SIGINT)  # Ctrl-C: the terminal's foreground group
    run.popen.wait(30)
    took = time.monotonic() - sent  # until make returned: the shell prompt
    assert not still_running(tree), run.log()[-3000:]
    log = run.log()
    assert took <= 7.0, f"{took:.1f} s from Ctrl-C to the prompt\n{log[-3000:]}"
    assert f"{task['id']} (demo.slow, step s0) (up to 6 s); they start no new step" in log
    assert "workers stopped in" in log and "had not stopped" not in log  # nothing was killed

    # s0 recorded, s1 never started; pending, no lease.
    assert checkpoints(run, task["id"]) == [("s0", "succeeded", 1)]
    assert task_row(run, task["id"]) == ("pending", "", None, 1)
    assert audit(run, task["id"])[-1] == (
        "release", "the workers are stopping: step s0 done, s1 starts on their next start")

    again = local_run(database=run.database)
    assert again.token == run.token  # 9b: the pasted $TOKEN still works ...
    password = re.compile(r"user admin\s+password (\S+)")
    assert password.search(again.log()).group(1) == password.search(log).group(1)
    assert api(again, "GET", f"/api/v1/tasks/{task['id']}")[0] == 200
    # ... and the task resumes at s1 long before its 60 s lease could have run out.
    deadline = time.monotonic() + 30
    while (state := api(again, "GET", f"/api/v1/tasks/{task['id']}")[1]["state"]) != "succeeded":
        assert state in ("pending", "running") and time.monotonic() < deadline, \
            again.log()[-3000:]
        time.sleep(0.2)
    assert checkpoints(again, task["id"]) == [("s0", "succeeded", 1), ("s1", "succeeded", 1)]
    assert [t for t, _ in audit(again, task["id"])] == ["claim", "release", "claim", "succeed"]
