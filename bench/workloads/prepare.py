"""Create (afresh) and migrate the bench database, and its API client.

    python -m bench.workloads.prepare        (PILOT's virtualenv, bench env)
"""

from __future__ import annotations

import psycopg

from bench.common import DB_NAME, db_url, emit_result
from bench.workloads import pilotdb


def recreate_database(name: str) -> None:
    """Drop and create `name` (only ever a pilot_bench* database)."""
    if not name.startswith("pilot_bench"):
        raise RuntimeError(f"refusing to drop {name}: not a bench database")
    with psycopg.connect(db_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    recreate_database(DB_NAME)
    pilotdb.setup()
    from django.core.management import call_command

    from bench.common import CLIENT_NAME
    from workflows.accounts import api_client_create

    call_command("migrate", interactive=False, verbosity=0)
    api_client_create(CLIENT_NAME)
    pilotdb.reset()
    emit_result({"database": DB_NAME})


if __name__ == "__main__":
    main()
