"""Every store this database has: the contract suite runs each test once per store."""

import pytest
from django.db import connection

from workflows.engine.store import store
from workflows.engine.store.orm import OrmStore


def _stores():
    if connection.vendor == "postgresql":
        from workflows.engine.store.postgres import PostgresStore

        return {"postgres": PostgresStore(), "orm": OrmStore()}
    return {connection.vendor: store(), "orm": OrmStore()}


@pytest.fixture(params=["native", "orm"])
def any_store(request, django_db_setup, django_db_blocker):
    """The database's own store (literal SQL on PostgreSQL), then the portable one."""
    with django_db_blocker.unblock():
        stores = _stores()
    native = next(s for k, s in stores.items() if k != "orm")
    return native if request.param == "native" else stores["orm"]
