"""What differs between the databases PILOT runs on, asked in one place.

Everything else — the engine, its store, the doors, the read side — calls a
function of this module and never branches on `connection.vendor` itself
(tests/engine/store/test_vendor.py holds that; migrations, being history, keep
their own). The store's verbs differ by class (`store()` picks the class by
`vendor_name()`); what is left here is the little the store's callers and the read
side need of the database itself.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from django.db import DatabaseError, close_old_connections, connection, connections, transaction


def vendor_name() -> str:
    """The default database's engine: "postgresql", "sqlite", …"""
    return connection.vendor


def is_postgresql() -> bool:
    return connection.vendor == "postgresql"


def serialize(kind: int, key: str) -> None:
    """Make the rest of the caller's transaction wait for every other
    transaction that serialized on (kind, key), and theirs for it. On
    PostgreSQL a transaction-scoped advisory lock (pg_advisory_xact_lock(int,
    hashtext)): the caps' and the webhook slots' "count, then take" run one at a
    time per client. Elsewhere nothing: SQLite's transaction holds the one write
    lock from BEGIN (IMMEDIATE), so no two of them run at once anyway."""
    if is_postgresql():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [kind, key])


@contextlib.contextmanager
def statement_time_limit(ms: int) -> Iterator[None]:
    """Reads inside give up (DatabaseError) on any statement that runs longer
    than `ms`: on PostgreSQL a transaction with SET LOCAL statement_timeout
    (gone with it). Elsewhere no limit and no transaction: a SQLite transaction
    would take the write lock for a read."""
    if not is_postgresql():
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL statement_timeout = {int(ms)}")
        yield


def database_state() -> str:
    """What a trigger would meet now, in one statement: "ok", "read-only"
    (every transaction would refuse a write: a PostgreSQL standby, or
    `default_transaction_read_only`) or "unreachable" (the connection is then
    closed, so that the next request reconnects)."""
    try:
        with connection.cursor() as cursor:
            if is_postgresql():
                cursor.execute("SELECT current_setting('transaction_read_only')")
                return "read-only" if cursor.fetchone() == ("on",) else "ok"
            cursor.execute("SELECT 1")
            return "ok" if cursor.fetchone() == (1,) else "unreachable"
    except DatabaseError:
        connection.close()
        return "unreachable"


def server_identity() -> tuple[str, int] | None:
    """Which database server this connection writes to, as (system identifier,
    timeline); None where there is no such thing (SQLite). A PostgreSQL
    standby keeps its primary's system identifier and starts a new timeline
    when it is promoted, so after a failover or switchover the pair differs
    even though the data (and the URL) are the same. The timeline is that of
    the WAL being written now, not the last checkpoint's, which lags a
    promotion. On a standby this raises (no WAL is written there): PILOT's
    writers cannot use one either."""
    if not is_postgresql():
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT system_identifier FROM pg_control_system())::text, "
            "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int")
        system_identifier, timeline = cursor.fetchone()
    return str(system_identifier), int(timeline)


# --- the connections -------------------------------------------------------------------
# The engine outside its store never holds a connection itself: a loop between
# passes, a run after a lost reply, a receiver after migrate ask here.


def in_transaction() -> bool:
    """Inside an atomic block (an enclosing transaction, a test's included): the
    connection is not the caller's to close."""
    return connection.in_atomic_block


P = ParamSpec("P")
R = TypeVar("R")


def in_callers_transaction(verb: Callable[P, R]) -> Callable[P, R]:
    """Mark a store verb that must run inside its caller's transaction — its
    row locks and its writes belong to the caller's decision (docs/design.md,
    "The store"); such a verb's name ends in `_in_tx`. Called outside one, it
    raises instead of taking locks that would end with its own statement."""
    @functools.wraps(verb)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        if not connection.in_atomic_block:
            raise RuntimeError(f"{verb.__qualname__} must run inside the caller's transaction")
        return verb(*args, **kwargs)

    return guarded


def drop_if_dead() -> None:
    """Close the default connection if it is unusable or past its age, so the
    next statement opens a new one (after a lost reply or a server restart)."""
    connection.close_if_unusable_or_obsolete()
    if connection.connection is not None and not connection.is_usable():
        connection.close()


def refresh_connections() -> None:
    """Between two passes of a loop: close what is unusable or past its age."""
    close_old_connections()


def close_connections() -> None:
    """After a database error a loop cannot trust any of its connections."""
    connections.close_all()


def has_table(name: str, using: str = "default") -> bool:
    return name in connections[using].introspection.table_names()


__all__ = ["close_connections", "database_state", "drop_if_dead", "has_table", "in_transaction",
           "is_postgresql", "refresh_connections", "serialize", "statement_time_limit",
           "vendor_name"]


def estimated_rows(queryset) -> int | None:
    """The planner's estimate of how many rows `queryset` returns (PostgreSQL:
    the top node's rows in EXPLAIN, from the statistics ANALYZE keeps; no row
    is read), or None on a database that cannot say cheaply."""
    if not is_postgresql():
        return None
    import json

    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])
