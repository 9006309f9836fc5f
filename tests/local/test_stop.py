"""`make run` stops within 10 s of SIGTERM or SIGINT, from anywhere, whatever
the queue holds, and says what it waits for.

Two workers each run a `demo.slow` step of a minute and more such tasks wait
in the queue: a graceful stop of django-q2's cluster would take minutes. The
workers get PILOT_STOP_SECONDS (6 s under `make run`) to finish, are then SIGKILLed (their
tasks resume from their last checkpoint once their leases expire), and every
process `make run` started is gone within 10 s of the signal."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import time

import pytest

from tests.local.conftest import skip_on_postgres, still_running

pytestmark = [pytest.mark.slow, skip_on_postgres]

BOUND = 10.0


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


def test_sigterm_stops_make_run_within_10_s_with_tasks_in_flight(local_run):
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


@pytest.mark.parametrize("how", ["kill -INT <make's pid>", "Ctrl-C in the terminal"])
def test_sigint_to_make_stops_everything_within_10_s(local_run, how):
    run = local_run(via_make=True)
    running = busy_workers(run)
    tree = run.tree()
    if how == "Ctrl-C in the terminal":  # the terminal signals its foreground process group
        os.killpg(run.popen.pid, signal.SIGINT)
        reason = "SIGINT"
    else:  # make neither passes it on to its recipe nor exits while the recipe runs
        os.kill(run.popen.pid, signal.SIGINT)
        reason = "SIGINT to make"
    sent = time.monotonic()
    stopped_within(run, tree, BOUND, sent)
    log = run.log()
    assert f"\n{reason}: stopping; waiting for the workers" in log
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
