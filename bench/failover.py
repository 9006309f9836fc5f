"""Time to resume after a PostgreSQL failover, over several primary kills: the figure
tests/ha/test_failover.py observes but does not assert (a timing is a benchmark's).

    REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python bench/failover.py \\
        [--kills 5] [--broker orm|redis]

A real Patroni cluster (tests/support/patroni.py: etcd, three PostgreSQL nodes,
synchronous replication, its own ports and temporary directory, torn down at the
end), gunicorn, a worker cluster and a dispatcher on the libpq multi-host URL, and
four clients triggering the atomic demo workflow (~8 a second), retrying on 503.
For each kill: the primary's machine dies (Patroni, postmaster, backends: SIGKILL),
then, once a replica leads, the old primary is started again and rejoins. Per kill:

- *503 window*: from the kill to the first 2xx answer after it;
- *resume*: from the kill to the first step a worker started on the new primary (the
  database's clock, which is this machine's);
- *recovered*: the leases the dispatcher took after the switch, and any it left
  to expire (the second should be 0).

Prints one line per kill, then p50 and max. At the end, the invariant checker runs
over every acknowledged task (nothing lost, nothing twice, atomic rows exact).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

CHECK = """
import json, sys
import django
django.setup()
from tests.faults.invariants import Observed, violations
acknowledged = {(int(o), k): t for o, k, t in json.load(open(sys.argv[1]))}
print(json.dumps(violations(Observed(acknowledged=acknowledged))))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--broker", choices=("orm", "redis"), default="orm")
    args = parser.parse_args()
    if args.broker == "redis" and not os.environ.get("REDIS_URL"):
        sys.exit("--broker redis needs REDIS_URL")
    os.environ.setdefault("DATABASE_URL", "sqlite:///:memory:")  # this process needs no database

    import django

    django.setup()
    from tests.support.haload import Load, start_stack
    from tests.support.patroni import PatroniCluster
    from tests.support.procs import wait_until

    rows = []
    with PatroniCluster() as ha:
        stack = start_stack(ha, args.broker, redis_url=os.environ.get("REDIS_URL", ""),
                            database="pilot_bench_failover")
        load = Load(stack, keys=100_000)
        try:
            for t in load.threads:
                t.start()
            load.more(10, "before the first kill")
            for n in range(1, args.kills + 1):
                old = ha.leader()
                name = f"kill{n}"

                def failover(old=old):
                    ha.kill_node(old)
                    ha.wait_leader(other_than=old)

                load.switch(name, failover)
                load.more(10, f"after kill {n}")
                wait_until(lambda name=name: f"{name}-recovering" in load.first_2xx_after, 60,
                           what="a 2xx after the kill")
                at = load.fault_wall[name]
                [(first_step,)] = ha.query(stack.db, "SELECT extract(epoch FROM min(started_at)) "
                                                     "FROM workflows_stepcheckpoint "
                                                     "WHERE started_at > to_timestamp(%s)",
                                     (load.back_wall[name],))
                rows.append({
                    "kill": n, "from": old, "to": ha.leader(),
                    "window": load.first_2xx_after[f"{name}-recovering"] - load.fault_at[name],
                    "resume": float(first_step) - at,
                })
                print(f"kill {n}: {old} -> {rows[-1]['to']}: 503 window "
                      f"{rows[-1]['window']:.1f} s, resume {rows[-1]['resume']:.1f} s",
                      flush=True)
                ha.start_node(old)
                ha.wait_replicas(2)
                load.more(5, "with the old primary back")
        finally:
            load.stop.set()
            for t in load.threads:
                t.join(60)

        def ended() -> bool:
            [(open_tasks,)] = ha.query(stack.db, "SELECT count(*) FROM workflows_task WHERE "
                                                 "state NOT IN ('succeeded','failed','cancelled')")
            return open_tasks == 0

        try:
            wait_until(ended, 120, interval=0.5, what="every task to end")
            recovered = dict(ha.query(stack.db, """
                SELECT CASE WHEN reason LIKE '%not renewed since the database switched%'
                            THEN 'after switch' ELSE 'expired' END, count(*)
                FROM workflows_tasktransition WHERE transition = 'recover' GROUP BY 1"""))
            owner = ha.query(stack.db, "SELECT id FROM auth_user WHERE username='upstream'")[0][0]
            ack = ROOT / "test-artifacts" / "bench-failover-acknowledged.json"
            ack.parent.mkdir(exist_ok=True)
            ack.write_text(json.dumps([[owner, k, t] for k, t in load.acknowledged.items()]))
            checked = stack.run("-c", CHECK, str(ack))
            found = json.loads(checked.stdout.strip().splitlines()[-1]) if checked.stdout else \
                [checked.stderr[-2000:]]
            statuses = {}
            for counter in load.by_phase.values():
                for status, count in counter.items():
                    statuses[status] = statuses.get(status, 0) + count
        finally:
            stack.stop_all()

    windows = [r["window"] for r in rows]
    resumes = [r["resume"] for r in rows]
    print(f"\n{args.broker} broker, {len(rows)} kills, {len(load.acknowledged)} acknowledged, "
          f"{len(load.duplicates)} duplicates (all the same task: "
          f"{all(a == b for _, a, b in load.duplicates)}); answers {statuses}")
    print(f"503 window: p50 {statistics.median(windows):.1f} s, max {max(windows):.1f} s")
    print(f"resume:     p50 {statistics.median(resumes):.1f} s, max {max(resumes):.1f} s")
    print(f"leases recovered: {recovered}; invariant violations: {len(found)}")
    for violation in found[:20]:
        print("  ", violation)
    if found or 500 in statuses:
        sys.exit(1)


if __name__ == "__main__":
    main()
