"""Create (afresh) and migrate the bench database, and its API client.

    python -m bench.workloads.prepare        (PILOT's virtualenv, bench env)

With DATABASE_URL=sqlite:///PATH (the embedded-mode section) the SQLite file
is removed and created again instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from bench.common import DB_NAME, OUT, db_url, emit_result
from bench.workloads import pilotdb


def recreate_database(name: str) -> None:
    """Drop and create `name` (only ever a pilot_bench* database)."""
    if not name.startswith("pilot_bench"):
        raise RuntimeError(f"refusing to drop {name}: not a bench database")
    with psycopg.connect(db_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def remove_sqlite(path: Path) -> None:
    """Remove the SQLite database `path` and its WAL files (only ever under bench/out)."""
    if OUT.resolve() not in path.resolve().parents:
        raise RuntimeError(f"refusing to remove {path}: not under {OUT}")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def main() -> None:
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith("sqlite:///"):
        remove_sqlite(Path(url[len("sqlite:///"):]))
        name = url
    else:
        recreate_database(DB_NAME)
        name = DB_NAME
    pilotdb.setup()
    from django.core.management import call_command

    from bench.common import CLIENT_NAME
    from workflows.accounts import api_client_create

    call_command("migrate", interactive=False, verbosity=0)
    api_client_create(CLIENT_NAME)
    pilotdb.reset()
    emit_result({"database": name})


if __name__ == "__main__":
    main()
