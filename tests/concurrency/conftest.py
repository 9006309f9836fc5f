import fcntl
import tempfile
from pathlib import Path

import pytest
from django.db import connection


@pytest.fixture
def enough_connections(transactional_db):
    """The races open one connection per thread; a stock PostgreSQL (100) is too
    small for 200 at once. .ci/run raises max_connections; locally, say so.

    Two such races at once — one on each pytest-xdist worker — would need twice
    that (seen: a barrier broken by a refused connection, 503s among the 200s),
    so a race holds a lock shared by every test process on this machine while it
    runs: they take turns on the server's connections."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        available = int(cursor.fetchone()[0])
    if available < 230:
        pytest.fail(f"PostgreSQL max_connections is {available}; these races need >= 230 "
                    "(ALTER SYSTEM SET max_connections = 500 and restart, as .ci/run does)")
    settings = connection.settings_dict
    name = f"pilot-tests-connections-{settings['HOST'] or 'local'}-{settings['PORT'] or 5432}"
    with open(Path(tempfile.gettempdir()) / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield
