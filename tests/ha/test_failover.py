"""A PostgreSQL failover loses nothing (docs/operations.md, "High availability"):
a real Patroni cluster (tests/support/patroni.py: etcd, three nodes, synchronous
replication), gunicorn, a worker cluster and a dispatcher connected by the libpq
multi-host URL, clients triggering distinct and duplicate keys of the atomic demo
workflow and retrying the same key on 503. The primary's machine dies (Patroni,
postmaster and backends, SIGKILL); later, with the old primary rejoined, a planned
switchover. Promised, and checked: every acknowledged task exists once and ends,
its atomic rows exact; a duplicate is answered with the first's task; no answer is
a 500; a 503 only inside a switch (from the fault until the service answers 2xx
again); /readyz 503 while no primary takes writes and 200 after; no process is
restarted, and none met a prepared statement missing on the new primary. Once per
broker: the ORM broker (messages in the same database) and Redis."""

import json
import time
from collections import Counter

import pytest
from django.conf import settings

from tests.support.haload import COUNT, Load, start_stack
from tests.support.patroni import PatroniCluster
from tests.support.procs import ROOT, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

CHECK_SCRIPT = """
import json, sys
import django
django.setup()
from tests.faults.invariants import Observed, violations
acknowledged = {(int(o), k): t for o, k, t in json.load(open(sys.argv[1]))}
print(json.dumps(violations(Observed(acknowledged=acknowledged))))
"""


@pytest.fixture(scope="module")
def ha():
    with PatroniCluster() as cluster:
        yield cluster


@pytest.fixture(params=["orm", pytest.param("redis", marks=pytest.mark.redis)])
def stack(request, ha):
    broker = request.param
    fleet = start_stack(ha, broker, redis_url=settings.REDIS_URL)
    try:
        yield fleet
    finally:
        fleet.stop_all()


def test_a_failover_and_a_switchover_lose_nothing_and_answer_no_500(stack):
    ha = stack.ha
    load = Load(stack)
    for t in load.threads:
        t.start()
    try:
        load.more(15, "before the failover")
        old = ha.leader()

        def failover():
            ha.kill_node(old)
            ha.wait_leader(other_than=old)

        load.switch("failover", failover)
        load.more(10, "after the failover")
        ha.start_node(old)  # the old primary rejoins as a replica (pg_rewind)
        ha.wait_replicas(2)
        load.more(5, "with the old primary back")
        load.switch("switchover", ha.switchover)
        load.more(10, "after the switchover")
    finally:
        load.stop.set()
        for t in load.threads:
            t.join(60)

    def finished() -> bool:
        for proc in stack.procs:
            assert proc.alive, f"{proc.name} died:\n{proc.log()[-3000:]}"
        [(open_tasks,)] = ha.query(stack.db, "SELECT count(*) FROM workflows_task WHERE state "
                                             "NOT IN ('succeeded', 'failed', 'cancelled')")
        return open_tasks == 0

    wait_until(finished, 90, interval=0.5, what="every task to end after the switches")
    ended = time.monotonic()

    statuses = sum(load.by_phase.values(), Counter())
    assert 500 not in statuses and set(statuses) <= {200, 202, 503}, load.by_phase
    for phase in ("warm-up", "failover-after", "switchover-after"):
        assert load.by_phase.get(phase, Counter())[503] == 0, load.by_phase
    assert "failover-after" in load.by_phase and "switchover-after" in load.by_phase, \
        f"the service never answered again after a switch: {load.by_phase}"
    assert load.by_phase["failover"][503] + load.by_phase.get("failover-recovering",
                                                              Counter())[503] > 0, \
        f"no client met the failover: {load.by_phase}"

    # Readiness follows the database: 503 while no primary takes writes, never a
    # hang, and 200 again once one does (the probe reconnects by itself).
    readyz = sum(load.readyz.values(), Counter())
    assert set(readyz) <= {200, 503}, load.readyz
    assert load.readyz["failover"][503] > 0, load.readyz
    assert load.readyz.get("switchover-after", Counter())[200] > 0, load.readyz

    # Every acknowledged task exists once and ended; duplicates were the same task.
    assert len(load.acknowledged) >= 40
    assert all(first == replay for _, first, replay in load.duplicates), load.duplicates
    assert load.duplicates
    owner_id = ha.query(stack.db, "SELECT id FROM auth_user WHERE username='upstream'")[0][0]
    ack_file = ROOT / "test-artifacts" / f"ha-acknowledged-{stack.broker}.json"
    ack_file.parent.mkdir(exist_ok=True)
    ack_file.write_text(json.dumps([[owner_id, k, t] for k, t in load.acknowledged.items()]))
    checked = stack.run("-c", CHECK_SCRIPT, str(ack_file))
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert json.loads(checked.stdout.strip().splitlines()[-1]) == []
    rows = dict(ha.query(stack.db, "SELECT idempotency_key, state FROM workflows_task"))
    assert set(rows) == set(load.acknowledged)  # nothing unacknowledged, nothing twice
    assert set(rows.values()) == {"succeeded"}, Counter(rows.values())
    orders = dict(ha.query(stack.db, "SELECT batch, count(*) FROM workflows_demoorder "
                                     "GROUP BY batch"))
    assert orders == dict.fromkeys(load.acknowledged, COUNT)  # atomic rows exact

    recovered = dict(ha.query(stack.db, """
        SELECT CASE WHEN reason LIKE '%not renewed since the database switched%'
                    THEN 'after switch' ELSE 'expired' END, count(*)
        FROM workflows_tasktransition WHERE transition = 'recover' GROUP BY 1"""))
    # Every reconnect found its statements: the prepared-statement cache is per
    # server session, never carried over to the new primary's.
    for proc in stack.procs:
        assert "prepared statement" not in proc.log(), f"{proc.name}:\n{proc.log()[-3000:]}"
    # Nothing waited for its lease to expire: the dispatcher saw the new primary
    # and took the leases the interrupted workers had given up (DatabaseWatch).
    assert "expired" not in recovered, recovered
    windows = {name: round(load.first_2xx_after[f"{name}-recovering"] - at, 1)
               for name, at in load.fault_at.items()}
    # Time to resume: from the fault to the first step a worker started on the new primary.
    resumed = {}
    for name, at in load.fault_wall.items():
        [(first,)] = ha.query(stack.db, "SELECT extract(epoch FROM min(started_at)) FROM "
                                        "workflows_stepcheckpoint WHERE started_at > "
                                        "to_timestamp(%s)", (load.back_wall[name],))
        resumed[name] = round(float(first) - at, 1)
    print(f"\n[{stack.broker}] {len(load.acknowledged)} acknowledged, "
          f"{len(load.duplicates)} duplicates; answers "
          f"{ {p: dict(c) for p, c in load.by_phase.items()} }; /readyz "
          f"{ {p: dict(c) for p, c in load.readyz.items()} }; 503 window (fault to first "
          f"2xx) {windows} s; resumed after {resumed} s; leases recovered {recovered}; all ended "
          f"{ended - load.fault_at['switchover']:.1f} s after the switchover began")
