"""PostgreSQL restarts under load, on a throwaway cluster of the test's own
(`tests/support/pgcluster.py`): a fast restart, then a crash (immediate stop) and a
start. Clients keep triggering through gunicorn the whole time, retrying with
the same key on 503 as upstreams do. The API must answer only 2xx or 503
(never 500), nothing acknowledged may be lost, workers and dispatcher must
reconnect by themselves, and the invariant checker must find nothing."""

import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from tests.faults.client import request
from tests.support.pgcluster import PgCluster
from tests.support.procs import ROOT, Fleet, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

CHECK_SCRIPT = """
import json, sys
import django
django.setup()
from tests.faults.invariants import Observed, violations
acknowledged = {(int(o), k): t for o, k, t in json.load(open(sys.argv[1]))}
print(json.dumps(violations(Observed(acknowledged=acknowledged))))
"""


@pytest.fixture
def stack():
    with PgCluster(max_connections=100) as pg:
        fleet = Fleet(DATABASE_URL=pg.create_database("pilot"), PILOT_LEASE_SECONDS=3,
                      PILOT_DISPATCHER_POLL_SECONDS=0.2)
        try:
            run = lambda *args: subprocess.run(  # noqa: E731
                [sys.executable, *args], cwd=ROOT, env=fleet.env, capture_output=True,
                text=True, timeout=180)
            assert run("manage.py", "migrate", "-v0").returncode == 0
            client = run("manage.py", "create_api_client", "upstream")
            assert client.returncode == 0, client.stderr
            fleet.token = re.search(r": token (\S+)", client.stdout).group(1)
            fleet.run = run
            fleet.dispatcher()
            fleet.workers()
            _, fleet.url = fleet.web(workers=2)
            fleet.pg = pg
            yield fleet
        finally:
            fleet.stop_all()


def test_restarts_under_load_answer_only_503_and_lose_nothing(stack):
    statuses: Counter = Counter()
    acknowledged: list = []
    stop = threading.Event()
    lock = threading.Lock()
    phase = ["warm-up"]  # which fault window an answer fell in
    by_phase: dict[str, Counter] = {p: Counter() for p in
                                     ("warm-up", "restart", "between", "crash", "after")}

    def client(n: int):
        # Paced and bounded (a few hundred tasks in all): enough to be mid-flight
        # through both restarts, few enough for the workers to finish promptly.
        i = 0
        while not stop.is_set() and i < 150:
            key = f"c{n}-{i}"
            body = {"workflow": "demo.sync_orders",
                    "payload": {"batch": key, "count": 20, "step_seconds": 0.02}}
            for _ in range(200):  # retry the same key until it is acknowledged
                try:
                    r = request(stack.url, "POST", "/api/v1/tasks", token=stack.token,
                                headers={"Idempotency-Key": key}, body=body, timeout=15)
                except OSError:
                    with lock:
                        statuses["no answer"] += 1
                    time.sleep(0.2)
                    continue
                with lock:
                    statuses[r.status] += 1
                    by_phase[phase[0]][r.status] += 1
                if r.status in (200, 202):
                    with lock:
                        acknowledged.append((key, r.json()["id"]))
                    break
                time.sleep(0.2)
            i += 1
            time.sleep(0.08)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    def acked() -> int:
        with lock:
            return len(acknowledged)

    def more_acknowledged(n: int, what: str):
        start = acked()
        wait_until(lambda: acked() >= start + n, 90, interval=0.05,
                   what=f"{n} more tasks acknowledged {what}")

    def answered_503(window: str):
        wait_until(lambda: by_phase[window][503] > 0, 30, interval=0.05,
                   what=f"a 503 in the {window} window")

    try:
        more_acknowledged(10, "before the restart")
        phase[0] = "restart"
        stack.pg.restart("fast")
        answered_503("restart")  # the restart was seen by the clients
        phase[0] = "between"
        more_acknowledged(10, "after the restart")
        # Atomic work in flight when the database crashes: a task whose atomic
        # `write` holds its transaction open (sleeping inside it) for two seconds.
        r = request(stack.url, "POST", "/api/v1/tasks", token=stack.token,
                    headers={"Idempotency-Key": "in-flight"}, timeout=15,
                    body={"workflow": "demo.sync_orders",
                          "payload": {"batch": "in-flight", "count": 20, "step_seconds": 2}})
        assert r.status == 202, r.body
        in_flight = r.json()["id"]
        with lock:
            acknowledged.append(("in-flight", in_flight))
        wait_until(lambda: stack.pg.query(
            "pilot", "SELECT 1 FROM workflows_stepcheckpoint WHERE task_id = %s "
                     "AND name = 'write' AND state = 'running'", (in_flight,)), 60,
            interval=0.05, what="the atomic step to be in flight")
        time.sleep(0.2)  # inside its two-second transaction
        phase[0] = "crash"
        stack.pg.stop("immediate")  # a crash: no shutdown checkpoint, connections cut
        answered_503("crash")
        stack.pg.start()
        phase[0] = "after"
        more_acknowledged(10, "after the crash")
    finally:
        stop.set()
        for t in threads:
            t.join(60)

    def finished():
        for proc in stack.procs:
            assert proc.alive, f"{proc.name} died:\n{proc.log()[-3000:]}"
        rows = stack.pg.query("pilot", "SELECT count(*) FROM workflows_task WHERE state NOT IN "
                                       "('succeeded', 'failed', 'cancelled')")
        return rows[0][0] == 0

    wait_until(finished, 180, interval=0.5, what="every task to finish after the restarts")
    assert set(statuses) <= {200, 202, 503, "no answer"}, statuses
    assert by_phase["restart"][503] > 0 and by_phase["crash"][503] > 0, by_phase
    assert statuses["no answer"] == 0, statuses  # gunicorn itself never went away
    owner_id = stack.pg.query("pilot", "SELECT id FROM auth_user WHERE username='upstream'")[0][0]
    ack_file = ROOT / "test-artifacts" / "pg-restart-acknowledged.json"
    ack_file.parent.mkdir(exist_ok=True)
    ack_file.write_text(json.dumps([[owner_id, key, task] for key, task in acknowledged]))
    checked = stack.run("-c", CHECK_SCRIPT, str(ack_file))
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert json.loads(checked.stdout.strip().splitlines()[-1]) == []
    states = dict(stack.pg.query("pilot", "SELECT state, count(*) FROM workflows_task "
                                          "GROUP BY 1"))
    assert set(states) == {"succeeded"} and states["succeeded"] >= len(acknowledged) > 20
    # The crash interrupted the atomic step: it ran again, and its rows landed once.
    [(write_attempts,)] = stack.pg.query(
        "pilot", "SELECT attempts FROM workflows_stepcheckpoint WHERE task_id = %s "
                 "AND name = 'write'", (in_flight,))
    assert write_attempts >= 2
    assert stack.pg.query("pilot", "SELECT count(*) FROM workflows_demoorder "
                                   "WHERE batch = 'in-flight'") == [(20,)]
    print(f"\n{len(acknowledged)} tasks acknowledged across two restarts; answers "
          f"{ {p: dict(c) for p, c in by_phase.items()} }; the in-flight atomic step ran "
          f"{write_attempts} times")
