"""The console's payload search (`payload.order_id=42`, workflows/admin/search.py)
through an index: a containment `payload @> '{"order_id": 42}'` is a bitmap
index scan on this GIN index (jsonb_path_ops: the smallest GIN for `@>`, the
only operator the search uses) instead of a filter over every task.

PostgreSQL only, and outside the model's Meta: SQLite has no GIN (its search
is a JSON key lookup, a scan of the filtered rows). Built CONCURRENTLY, so
the task table stays writable while it builds; that needs a migration
outside a transaction (atomic = False)."""

from django.db import migrations

CREATE = ("CREATE INDEX CONCURRENTLY IF NOT EXISTS pilot_task_payload_gin_idx "
          "ON workflows_task USING gin (payload jsonb_path_ops)")
DROP = "DROP INDEX CONCURRENTLY IF EXISTS pilot_task_payload_gin_idx"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("workflows", "0029_step_failures"),
    ]

    operations = [
        migrations.RunPython(create, drop, elidable=False),
    ]
