"""Autovacuum and analyze for the tables that churn (issue 34, docs/operations.md,
"What a day of history costs"). PostgreSQL's defaults wait for 20 % of a table
to be dead before vacuuming it and 10 % changed before analyzing it: at 8.6 M
retained tasks that is 1.7 M dead task rows (and 5 M steps, 7 M transitions)
before the first vacuum, every index scan wading through them meanwhile, and
the planner's view of the small active set hours stale. Per table instead:

- the history (tasks, steps, transitions, replays): vacuum at 2 % dead, analyze
  at 1 % changed, so a cleanup's batches of a day are vacuumed behind it;
- the rows that turn over whole (webhook deliveries, the activity minutes):
  vacuum at 5 %, analyze at 2 %.

A storage parameter only: no rewrite, no lock beyond a moment's. SQLite has no
vacuum to tune: nothing to do there."""

from django.db import migrations

HISTORY = {"autovacuum_vacuum_scale_factor": "0.02",
           "autovacuum_analyze_scale_factor": "0.01"}
TURNOVER = {"autovacuum_vacuum_scale_factor": "0.05",
            "autovacuum_analyze_scale_factor": "0.02"}
TABLES = {
    "workflows_task": HISTORY,
    "workflows_stepcheckpoint": HISTORY,
    "workflows_tasktransition": HISTORY,
    "workflows_taskreplay": HISTORY,
    "workflows_webhookdelivery": TURNOVER,
    "workflows_activityminute": TURNOVER,
}


def tune(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table, options in TABLES.items():
            settings = ", ".join(f"{name} = {value}" for name, value in options.items())
            schema_editor.execute(f"ALTER TABLE {table} SET ({settings})")


def reset(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table, options in TABLES.items():
            schema_editor.execute(f"ALTER TABLE {table} RESET ({', '.join(options)})")


class Migration(migrations.Migration):

    dependencies = [
        ("workflows", "0030_task_payload_gin_idx"),
    ]

    operations = [
        migrations.RunPython(tune, reset, elidable=False),
    ]
