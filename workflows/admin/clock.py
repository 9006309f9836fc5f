"""The console's "now": the database's clock (docs/design.md, "Time").

Every time the console shows or compares — a task's age, a running task's
duration, which leases have passed, the current hour of the activity chart —
is measured against the clock that stamped the rows: the database's. A web
server whose clock runs a minute ahead would otherwise list healthy tasks as
past their lease, and one behind would hide stuck ones.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models.functions import Now

from workflows.engine import database_now

# For querysets: each row carries the database's now (`pilot_now`), read by the
# statement that read the row.
DB_NOW = Now()


def console_now() -> datetime:
    """The database's time, now (one query)."""
    return database_now()
