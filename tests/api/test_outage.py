"""A database outage is a 503 `unavailable` problem, never a 500. The outage is
real: the connection is pointed at a port where no server listens, then back."""

import contextlib

import pytest
from django.db import connection

from tests.api.conftest import assert_problem, trigger

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@contextlib.contextmanager
def database_down():
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["PORT"] = "1"
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


def test_requests_during_a_database_outage_get_503_and_recover_after(api, anon):
    with database_down():
        r = trigger(api)
        body = assert_problem(r, 503, "unavailable")
        assert r["Retry-After"] == "2" and "database" in body["detail"]
        assert_problem(api.get("/api/v1/tasks"), 503, "unavailable")
        ready = anon.get("/readyz")
        assert_problem(ready, 503, "unavailable")
        assert ready.json()["checks"]["database"] is False
        assert anon.get("/healthz").status_code == 200  # the process itself is alive
    assert trigger(api).status_code == 202
    assert anon.get("/readyz").status_code == 200


@contextlib.contextmanager
def database_read_only():
    """Every transaction of the connection read-only, as on a standby after a
    failover: PostgreSQL itself refuses each write (SQLSTATE 25006)."""
    saved = dict(connection.settings_dict)
    options = dict(saved.get("OPTIONS") or {})
    options["options"] = "-c default_transaction_read_only=on"
    connection.close()
    connection.settings_dict["OPTIONS"] = options
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


def test_a_read_only_database_makes_readiness_503_and_a_trigger_503_not_500(api, anon):
    with database_read_only():
        with connection.cursor() as cursor:  # the fault landed: PostgreSQL says so
            cursor.execute("SHOW transaction_read_only")
            assert cursor.fetchone() == ("on",)
        ready = anon.get("/readyz")
        body = assert_problem(ready, 503, "unavailable")
        assert body["checks"]["database"] is False
        assert body["degraded"]["database"] == "read-only"
        assert "read-only" in body["detail"]
        r = trigger(api)
        body = assert_problem(r, 503, "unavailable")
        assert r["Retry-After"] == "2" and "read-only" in body["detail"]
        assert anon.get("/healthz").status_code == 200
    assert anon.get("/readyz").status_code == 200
    assert trigger(api).status_code == 202
