"""A task's idempotency TTL, fixed when it is triggered (docs/design.md, "Data
model"): its ending computes `expires_at` from its own column, never from the
registry of the day (a deploy that shortens a TTL or removes a workflow must not
change the lifetime of keys already given).

Existing rows get their workflow's TTL from the registry as this migration
finds it; a workflow no longer registered keeps the default (24 h), which is
also the column's database default (rows inserted by raw SQL that predates the
column). Only workflows with another TTL are updated: one UPDATE each."""

import datetime

from django.db import migrations, models

DEFAULT_IDEMPOTENCY_TTL = datetime.timedelta(days=1)  # workflows.registry's, as of this migration


def backfill(apps, schema_editor):
    from workflows.registry import registry

    Task = apps.get_model("workflows", "Task")
    for workflow in registry.all():
        if workflow.idempotency_ttl != DEFAULT_IDEMPOTENCY_TTL:
            Task.objects.filter(workflow=workflow.name).update(
                idempotency_ttl=workflow.idempotency_ttl)


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0015_fair_claims'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='idempotency_ttl',
            field=models.DurationField(db_default=datetime.timedelta(days=1), default=datetime.timedelta(days=1)),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=False),
    ]
