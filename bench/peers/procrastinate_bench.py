"""Procrastinate on the end-to-end workload (bench/.venv only; never a PILOT dependency).

    bench/.venv/bin/python -m bench.peers.procrastinate_bench --runs 2000 --workers 2

The workload: one job per run that writes three rows (each its own autocommit
INSERT, like the raw django-q2 task). W worker processes (like W qcluster
workers), each running one job at a time (concurrency 1), woken by
LISTEN/NOTIFY. Jobs are deferred with `batch_defer` in batches of 1000; the run
ends when every run's three rows are written.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

from bench.common import BENCH_PY, Proc, RssSampler, db_url, emit_result, percentile
from bench.peers import peerdb

DB = "pilot_bench_procrastinate"
QUEUE = "bench"
CONCURRENCY = 1
BATCH = 1000
ROWS_TABLE = """
CREATE TABLE bench_rows (
    id bigserial PRIMARY KEY,
    run text NOT NULL,
    index smallint NOT NULL,
    name text NOT NULL,
    state text NOT NULL,
    output jsonb,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    UNIQUE (run, index)
)"""


def make_app():
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=db_url(DB), min_size=1, max_size=3))
    _connection = None

    @app.task(queue=QUEUE, name="write3")
    async def write3(run_id: str, enqueued_at: float) -> None:
        import psycopg

        nonlocal _connection
        if _connection is None:
            _connection = await psycopg.AsyncConnection.connect(db_url(DB), autocommit=True)
        for index, name in enumerate(("one", "two", "three")):
            await _connection.execute(
                "INSERT INTO bench_rows (run, index, name, state, output, started_at, "
                "finished_at) VALUES (%s, %s, %s, 'succeeded', %s, now(), now())",
                (run_id, index, name, str(index + 1)))

    return app, write3


def worker() -> None:
    app, _ = make_app()
    app.run_worker(queues=[QUEUE], concurrency=CONCURRENCY, wait=True,
                   install_signal_handlers=True)


def run(runs: int, workers: int) -> None:
    peerdb.recreate(DB)
    app, write3 = make_app()
    with app.open():
        app.schema_manager.apply_schema()
    peerdb.execute(DB, ROWS_TABLE)
    tag = f"procrastinate-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = {f"worker{i}": Proc(f"{tag}-worker{i}", [BENCH_PY, "-m",
                                                     "bench.peers.procrastinate_bench", "worker"],
                                env) for i in range(workers)}
    for proc in procs.values():
        proc.start()
    sampler = RssSampler(procs)
    sampler.start()
    try:
        with app.open():
            _defer(write3, f"{tag}-w-", 1)
            _wait(f"{tag}-w-", 1, procs, timeout=120)
            before = peerdb.counters(DB)
            t0 = time.time()
            _defer(write3, f"{tag}-r-", runs)
            t_end = _wait(f"{tag}-r-", runs, procs, timeout=600)
    finally:
        for proc in procs.values():
            proc.stop()
        peaks = sampler.stop()
    time.sleep(0.5)  # the stopped sessions' statistics reach pg_stat_database
    costs = peerdb.per_run(before, peerdb.counters(DB), runs)
    lags = [float(r[0]) for r in peerdb.query(
        DB, "SELECT extract(epoch FROM r.started_at) - (j.args->>'enqueued_at')::float "
            "FROM bench_rows r JOIN procrastinate_jobs j ON j.args->>'run_id' = r.run "
            "WHERE r.index = 0 AND r.run LIKE %s", (f"{tag}-r-%",))]
    seconds = t_end - t0
    emit_result({"system": "procrastinate", "workers": workers, "runs": runs,
                 "seconds": round(seconds, 3), "runs_per_s": round(runs / seconds, 2),
                 "lag_p50_ms": _ms(percentile(lags, 50)), "lag_p99_ms": _ms(percentile(lags, 99)),
                 "per_run": costs,
                 "rss": {"worker": round(max(mb for _, mb in peaks.values()), 1)}})


def _ms(seconds):
    return None if seconds is None else round(seconds * 1000, 1)


def _defer(write3, prefix: str, n: int) -> None:
    for start in range(0, n, BATCH):
        write3.batch_defer(*[{"run_id": f"{prefix}{i}", "enqueued_at": time.time()}
                             for i in range(start, min(n, start + BATCH))])


def _wait(prefix: str, n: int, procs: dict, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while True:
        peerdb.check_alive(procs)
        [(rows, last)] = peerdb.query(DB, "SELECT count(*), extract(epoch FROM max(finished_at)) "
                                          "FROM bench_rows WHERE run LIKE %s", (prefix + "%",))
        if rows >= 3 * n:
            return float(last)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rows // 3}/{n} Procrastinate runs done after {timeout}s")
        time.sleep(0.2)


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        worker()
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    run(args.runs, args.workers)


if __name__ == "__main__":
    main()
