"""Each peer's own database on the bench PostgreSQL server."""

from __future__ import annotations

import psycopg

from bench.common import db_url


def recreate(name: str) -> None:
    """Drop and create `name` (only ever a pilot_bench_* database)."""
    if not name.startswith("pilot_bench_"):
        raise RuntimeError(f"refusing to drop {name}: not a bench database")
    with psycopg.connect(db_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def query(name: str, sql: str, params=()) -> list[tuple]:
    with psycopg.connect(db_url(name), autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def execute(name: str, sql: str) -> None:
    with psycopg.connect(db_url(name), autocommit=True) as conn:
        conn.execute(sql)


def check_alive(procs: dict) -> None:
    """Fail at once, not at the timeout, when a worker process died."""
    for name, proc in procs.items():
        if not proc.alive:
            raise RuntimeError(f"{name} exited; see {proc.log_path}")


def counters(name: str) -> dict:
    """The database's cumulative transactions and rows written (pg_stat_database);
    a session's figures arrive when it ends, so read after stopping the workers."""
    [row] = query(name, "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, "
                        "tup_deleted FROM pg_stat_database WHERE datname = %s", (name,))
    return dict(zip(["commits", "rollbacks", "inserted", "updated", "deleted"], row,
                    strict=True))


def per_run(before: dict, after: dict, runs: int) -> dict:
    return {k: round((after[k] - before[k]) / runs, 2) for k in before}
