"""The shared cache's table exists whatever the broker was when `migrate` ran
(migrations 0004 and 0008), so a deployment that drops REDIS_URL later finds
it, instead of a cache that fails on every call."""

import importlib

import pytest
from django.db import connection
from django.test import override_settings

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_CACHE = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                           "LOCATION": "redis://redis.internal:6379/0"}}


def table_exists() -> bool:
    return "pilot_cache" in connection.introspection.table_names()


@pytest.mark.parametrize("migration", ["0004_cache_table",
                                       "0008_cache_table_whatever_the_broker"])
def test_the_migration_creates_the_table_while_the_cache_is_redis(migration):
    module = importlib.import_module(f"workflows.migrations.{migration}")
    with connection.schema_editor() as editor:
        editor.execute(editor.sql_delete_table % {"table": editor.quote_name("pilot_cache")})
    assert not table_exists()
    try:
        with override_settings(CACHES=REDIS_CACHE), connection.schema_editor() as editor:
            module.create_cache_table(None, editor)
        assert table_exists()
        with connection.schema_editor() as editor:  # a second run changes nothing
            module.create_cache_table(None, editor)
    finally:
        if not table_exists():
            with connection.schema_editor() as editor:
                importlib.import_module("workflows.migrations.0004_cache_table") \
                    .create_cache_table(None, editor)
