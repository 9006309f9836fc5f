"""The store: every write the engine makes, as named verbs (docs/design.md, "The store").

The engine never asks which database it runs on; it asks `store()` and calls
verbs — `claim`, `resume`, `write_steps`, `renew`, `check`, `save_progress`,
`transition`, `create_or_replay`, `db_now`, `atomic_step`. There are two
implementations, run by one contract suite (tests/engine/store/):

- `OrmStore` (orm.py): Django's ORM and portable SQL, correct everywhere;
  `SqliteStore` adapts it to SQLite's single writer;
- `PostgresStore` (postgres.py): the hot verbs as one literal statement each
  (sql.py: composed from named fragments, each rule once), the rest inherited.
"""

from __future__ import annotations

from datetime import datetime

from workflows import database
from workflows.engine.store.orm import Claimed, Moved, OrmStore, SqliteStore
from workflows.engine.store.rows import StepRow

_STORES: dict[str, OrmStore] = {}


def store() -> OrmStore:
    """The store for the default database's engine."""
    vendor = database.vendor_name()
    if vendor not in _STORES:
        if vendor == "postgresql":
            from workflows.engine.store.postgres import PostgresStore

            _STORES[vendor] = PostgresStore()
        elif vendor == "sqlite":
            _STORES[vendor] = SqliteStore()
        else:
            _STORES[vendor] = OrmStore()
    return _STORES[vendor]


def database_now() -> datetime:
    """The database server's clock, now: every decision compares with this
    clock, however wrong the clocks of the machines involved are."""
    return store().db_now()


__all__ = ["Claimed", "Moved", "OrmStore", "StepRow", "database_now", "store"]
