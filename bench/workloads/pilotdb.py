"""Database chores shared by the PILOT workloads. Import after django.setup()
(`bench.workloads.pilotdb.setup()` does it)."""

from __future__ import annotations

import os


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()


def reset() -> None:
    """Empty every table a workload writes (tasks and their children, the
    baselines' rows, django-q2's queue) and the bench Redis DB. The API client
    and its token stay."""
    from django.conf import settings
    from django.db import connection
    from django_q.models import OrmQ
    from django_q.models import Task as QTask

    from bench.ceiling.models import BareStep, BareTask
    from workflows.models import StepCheckpoint, Task, TaskReplay, TaskTransition

    models = [StepCheckpoint, TaskTransition, TaskReplay, Task, BareTask, BareStep, OrmQ, QTask]
    tables = [connection.ops.quote_name(m._meta.db_table) for m in models]
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":  # the embedded-mode rows (bench/workloads/embedded.py)
            for table in tables:
                cursor.execute(f"DELETE FROM {table}")
        else:
            cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
    if settings.REDIS_URL:
        redis_flush(settings.REDIS_URL)


def redis_flush(url: str) -> None:
    """FLUSHDB on the bench's own Redis DB number (never another one)."""
    import redis

    from bench.common import REDIS_URL

    if url != REDIS_URL:
        raise RuntimeError(f"refusing to flush {url}: the bench owns only {REDIS_URL}")
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()


def owner():
    from django.contrib.auth import get_user_model

    from bench.common import CLIENT_NAME

    return get_user_model().objects.get(username=CLIENT_NAME)


def token() -> str:
    """A fresh token for the benchmark's client (only hashes are stored, so the
    one issued at prepare time cannot be read back); the previous one stops
    working, so call it once per workload."""
    from workflows.accounts import api_token_issue

    return api_token_issue(owner())


def db_counters() -> dict:
    """This database's cumulative counters (pg_stat_database): transactions and
    rows written; and the server's WAL position in bytes (the same figure as
    pg_stat_wal.wal_bytes, read without waiting for sessions to flush their
    statistics; server-wide, so other databases' writes count too). Other
    sessions' stats arrive when they end, so read this after stopping the
    processes whose work it should include. Empty on SQLite."""
    from django.db import connection

    if connection.vendor != "postgresql":  # SQLite keeps no such statistics
        return {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint "
            "FROM pg_stat_database WHERE datname = current_database()")
        row = cursor.fetchone()
    return dict(zip(["commits", "rollbacks", "inserted", "updated", "deleted", "wal_bytes"],
                    row, strict=True))
