"""The throwaway PostgreSQL helper that outage tests rely on."""

import psycopg
import pytest

from tests.support.pgcluster import PgCluster

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_a_private_cluster_survives_fast_and_crash_restarts_and_is_removed():
    with PgCluster() as pg:
        assert pg.port != 5432
        pg.create_database("t")
        pg.query("t", "CREATE TABLE x (n int)")
        pg.query("t", "INSERT INTO x VALUES (1)")
        conn = psycopg.connect(pg.url("t"), autocommit=True)
        pg.restart()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")  # the old connection is gone
        pg.query("t", "INSERT INTO x VALUES (2)")
        pg.crash_restart()
        assert pg.query("t", "SELECT sum(n) FROM x") == [(3,)]
        pg.stop()
        assert not pg.running
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg.url("t"), connect_timeout=2)
        pg.start()
        assert pg.query("t", "SELECT count(*) FROM x") == [(2,)]
        root = pg.root
    import os

    assert not os.path.exists(root)
