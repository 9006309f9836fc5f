"""Completion webhooks that outlive their task, and hold no more than their
share of the workers (docs/webhooks.md, "Retries and what is guaranteed" and
"Slow and failing receivers").

- A delivery no longer hangs off its task: the reference keeps `task_id` (the
  <task id> of its webhook-id) without a database constraint, so cleanup and an
  expired key's re-trigger delete the task and leave its pending delivery to
  be sent. What a send needs without the task is copied onto the row:
  `owner` (the signing secret, the client's cap) and `traceparent`; the body
  is fixed before the task goes (engine code). `detached_at`: when its task
  went.
- `endpoint` (host:port, written by a claim) and `resend_owed` serve the caps
  and the breaker; `WebhookEndpoint` is the breaker's state per endpoint.

Existing rows get their task's owner and traceparent (every row has its task:
until now the foreign key cascaded), and the pending ones their endpoint.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def backfill(apps, schema_editor):
    from workflows.webhooks.targets import endpoint_of

    Delivery = apps.get_model("workflows", "WebhookDelivery")
    Task = apps.get_model("workflows", "Task")
    task = Task.objects.filter(pk=OuterRef("task_id"))
    Delivery.objects.update(owner_id=Subquery(task.values("owner_id")[:1]),
                            traceparent=Subquery(task.values("traceparent")[:1]))
    pending = Delivery.objects.filter(state="pending", endpoint="")
    for url in pending.values_list("url", flat=True).distinct().order_by():
        pending.filter(url=url).update(endpoint=endpoint_of(url))
    if schema_editor.connection.vendor == "postgresql":
        # The owner's foreign key is checked at commit (deferred): check it now,
        # so that the ALTER below finds no pending trigger event on the table.
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0016_task_idempotency_ttl'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='WebhookEndpoint',
            fields=[
                ('key', models.CharField(max_length=2000, primary_key=True, serialize=False)),
                ('failures', models.PositiveIntegerField(default=0)),
                ('trips', models.PositiveIntegerField(default=0)),
                ('paused_until', models.DateTimeField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True, default='')),
                ('last_failure_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'webhook endpoint',
            },
        ),
        migrations.AddField(
            model_name='webhookdelivery',
            name='detached_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='webhookdelivery',
            name='endpoint',
            field=models.CharField(blank=True, db_default='', default='', max_length=2000),
        ),
        migrations.AddField(
            model_name='webhookdelivery',
            name='owner',
            field=models.ForeignKey(db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='webhookdelivery',
            name='resend_owed',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name='webhookdelivery',
            name='traceparent',
            field=models.CharField(blank=True, db_default='', default='', max_length=55),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=False),
        migrations.AlterField(
            model_name='webhookdelivery',
            name='owner',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(
            model_name='webhookdelivery',
            name='task',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='deliveries', to='workflows.task'),
        ),
        migrations.AddIndex(
            model_name='webhookdelivery',
            index=models.Index(condition=models.Q(('claimed_until__isnull', False)), fields=['claimed_until'], name='delivery_claimed_idx'),
        ),
        migrations.AddIndex(
            model_name='webhookdelivery',
            index=models.Index(condition=models.Q(('enqueued_at__isnull', False), ('state', 'pending')), fields=['enqueued_at'], name='delivery_sent_idx'),
        ),
        migrations.AddIndex(
            model_name='webhookdelivery',
            index=models.Index(condition=models.Q(('enqueued_at__isnull', True), ('state', 'pending')), fields=['owner', 'next_attempt_at'], name='delivery_owed_owner_idx'),
        ),
        migrations.AddIndex(
            model_name='webhookdelivery',
            index=models.Index(condition=models.Q(('enqueued_at__isnull', True), ('state', 'pending')), fields=['endpoint', 'next_attempt_at'], name='delivery_owed_endpoint_idx'),
        ),
        migrations.AddIndex(
            model_name='webhookdelivery',
            index=models.Index(condition=models.Q(('detached_at__isnull', False)), fields=['id'], name='delivery_detached_idx'),
        ),
        migrations.AddIndex(
            model_name='webhookendpoint',
            index=models.Index(condition=models.Q(('failures__gt', 0)), fields=['key'], name='webhook_endpoint_failing_idx'),
        ),
    ]
