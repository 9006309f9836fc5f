"""DBOS Transact on the end-to-end workload (bench/.venv only; never a PILOT dependency).

    bench/.venv/bin/python -m bench.peers.dbos_bench --runs 2000 --workers 2

The workload: a workflow of three steps, each a no-op returning a number; DBOS
checkpoints every step's output in its system database (operation_outputs),
as PILOT checkpoints each step. W executor processes (like W qcluster workers)
each dequeue from one DBOS queue, polled every 0.1 s (django-q2's poll in
PILOT's cluster) with up to WORKER_CONCURRENCY workflows in flight per process
(DBOS runs workflows in threads). Runs are enqueued with DBOSClient; the run
ends when every workflow's status is SUCCESS (workflow_status.updated_at).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import uuid

from bench.common import BENCH_PY, Proc, RssSampler, db_url, emit_result, percentile
from bench.peers import peerdb

DB = "pilot_bench_dbos"
QUEUE = "bench"
WORKER_CONCURRENCY = 4
POLL_SECONDS = 0.1


def worker(index: int) -> None:
    from dbos import DBOS

    DBOS(config={"name": "pilot-bench", "system_database_url": db_url(DB),
                 "executor_id": f"bench-{index}", "log_level": "WARNING",
                 "sys_db_pool_size": 8})

    @DBOS.step()
    def one() -> int:
        return 1

    @DBOS.step()
    def two() -> int:
        return 2

    @DBOS.step()
    def three() -> int:
        return 3

    @DBOS.workflow(name="noop3")
    def noop3(n: int) -> int:
        return one() + two() + three()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    DBOS.launch()
    DBOS.register_queue(QUEUE, worker_concurrency=WORKER_CONCURRENCY,
                        polling_interval_sec=POLL_SECONDS)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=5)


def run(runs: int, workers: int) -> None:
    from dbos import DBOSClient

    peerdb.recreate(DB)
    _migrate()
    tag = f"dbos-{uuid.uuid4().hex[:8]}"
    procs = {f"worker{i}": Proc(f"{tag}-worker{i}", [BENCH_PY, "-m", "bench.peers.dbos_bench",
                                                     "worker", str(i)], _env())
             for i in range(workers)}
    for proc in procs.values():
        proc.start()
    sampler = RssSampler(procs)
    sampler.start()
    client = DBOSClient(system_database_url=db_url(DB), system_database_pool_size=2)
    try:
        _enqueue(client, f"{tag}-w-", 1)
        _wait(f"{tag}-w-", 1, procs, timeout=120)
        before = peerdb.counters(DB)
        t0 = time.time()
        _enqueue(client, f"{tag}-r-", runs)
        t_end = _wait(f"{tag}-r-", runs, procs, timeout=600)
    finally:
        client.destroy()
        for proc in procs.values():
            proc.stop()
        peaks = sampler.stop()
    time.sleep(0.5)  # the stopped sessions' statistics reach pg_stat_database
    costs = peerdb.per_run(before, peerdb.counters(DB), runs)
    lags = peerdb.query(DB, "SELECT (started_at_epoch_ms - created_at) / 1000.0 "
                            "FROM dbos.workflow_status WHERE workflow_uuid LIKE %s",
                        (f"{tag}-r-%",))
    lags = [float(r[0]) for r in lags if r[0] is not None]
    seconds = t_end - t0
    emit_result({"system": "dbos", "workers": workers, "runs": runs,
                 "seconds": round(seconds, 3), "runs_per_s": round(runs / seconds, 2),
                 "lag_p50_ms": _ms(percentile(lags, 50)), "lag_p99_ms": _ms(percentile(lags, 99)),
                 "per_run": costs,
                 "rss": {"worker": round(max(mb for _, mb in peaks.values()), 1)}})


def _ms(seconds):
    return None if seconds is None else round(seconds * 1000, 1)


def _env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1")


def _migrate() -> None:
    """Let one DBOS process create its schema before the timed workers start."""
    Proc("dbos-migrate", [BENCH_PY, "-m", "bench.peers.dbos_bench", "migrate"], _env()) \
        .start().popen.wait(120)


def _enqueue(client, prefix: str, n: int) -> None:
    for i in range(n):
        client.enqueue({"queue_name": QUEUE, "workflow_name": "noop3",
                        "workflow_id": f"{prefix}{i}"}, i)


def _wait(prefix: str, n: int, procs: dict, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while True:
        peerdb.check_alive(procs)
        [(done, bad, last)] = peerdb.query(
            DB, "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), "
                "count(*) FILTER (WHERE status IN ('ERROR', 'CANCELLED', "
                "'MAX_RECOVERY_ATTEMPTS_EXCEEDED')), max(updated_at) "
                "FROM dbos.workflow_status WHERE workflow_uuid LIKE %s", (prefix + "%",))
        if bad:
            raise RuntimeError(f"{bad} DBOS workflow(s) failed; see bench/out/logs")
        if done >= n:
            return last / 1000
        if time.monotonic() > deadline:
            raise TimeoutError(f"{done}/{n} DBOS runs done after {timeout}s")
        time.sleep(0.2)


def migrate() -> None:
    from dbos import DBOS

    DBOS(config={"name": "pilot-bench", "system_database_url": db_url(DB),
                 "log_level": "WARNING"})
    DBOS.launch()
    DBOS.destroy()


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        worker(int(sys.argv[2]))
        return
    if sys.argv[1:2] == ["migrate"]:
        migrate()
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    run(args.runs, args.workers)


if __name__ == "__main__":
    main()
