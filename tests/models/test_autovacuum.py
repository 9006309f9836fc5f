"""Migration 0031: the churning tables carry their own autovacuum and analyze
thresholds on PostgreSQL (issue 34, docs/operations.md, "What a day of history
costs"), and migrating back removes them again."""

import importlib

import pytest
from django.db import connection

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

MIGRATION = importlib.import_module("workflows.migrations.0031_autovacuum_hot_tables")


def reloptions() -> dict[str, dict[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s)",
                       [list(MIGRATION.TABLES)])
        return {name: dict(option.split("=", 1) for option in options or [])
                for name, options in cursor.fetchall()}


def test_the_hot_tables_vacuum_early_and_migrating_back_resets_them():
    tuned = reloptions()
    assert set(tuned) == set(MIGRATION.TABLES) and set(tuned) >= {
        "workflows_task", "workflows_stepcheckpoint", "workflows_tasktransition",
        "workflows_webhookdelivery", "workflows_activityminute"}
    for table, options in tuned.items():
        assert float(options["autovacuum_vacuum_scale_factor"]) <= 0.05, (table, options)
        assert float(options["autovacuum_analyze_scale_factor"]) <= 0.02, (table, options)
    assert tuned["workflows_task"] == MIGRATION.HISTORY
    # The migration's own backward and forward operations (the test's
    # transaction rolls both back).
    [operation] = MIGRATION.Migration.operations
    with connection.schema_editor(atomic=False) as editor:
        operation.reverse_code(None, editor)
        assert reloptions() == {table: {} for table in MIGRATION.TABLES}
        operation.code(None, editor)
    assert reloptions() == tuned
