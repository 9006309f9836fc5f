import pytest
from django.db import connection


@pytest.fixture
def enough_connections(transactional_db):
    """The races open one connection per thread; a stock PostgreSQL (100) is too
    small for 200 at once. .ci/run raises max_connections; locally, say so."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        available = int(cursor.fetchone()[0])
    if available < 230:
        pytest.fail(f"PostgreSQL max_connections is {available}; these races need >= 230 "
                    "(ALTER SYSTEM SET max_connections = 300 and restart, as .ci/run does)")
