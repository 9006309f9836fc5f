"""Completion webhooks (docs/webhooks.md): a client's signing secret and default
endpoint (ClientWebhook), the outbox of deliveries (WebhookDelivery), a task's
endpoint (`callback_url`) and restart count (`restarts`: the <n> of its
webhook ids; tasks restarted before this migration count from 0 — they have
no deliveries to collide with); trace context (`traceparent`,
docs/tracing.md); and the operators' right to re-send a delivery."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.contrib.auth.management import create_permissions
from django.db import migrations, models

OPERATOR_PERMISSIONS = ["resend_webhook"]


def _permissions(apps):
    # Permissions are created after all migrations (post_migrate); create the
    # new one now so that the grant works on a fresh database.
    app_config = apps.get_app_config("workflows")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    Permission = apps.get_model("auth", "Permission")
    return list(Permission.objects.filter(content_type__app_label="workflows",
                                          codename__in=OPERATOR_PERMISSIONS))


def grant(apps, schema_editor):
    group = apps.get_model("auth", "Group").objects.filter(name="operators").first()
    if group is not None:
        group.permissions.add(*_permissions(apps))


def revoke(apps, schema_editor):
    group = apps.get_model("auth", "Group").objects.filter(name="operators").first()
    if group is not None:
        group.permissions.remove(*_permissions(apps))


class Migration(migrations.Migration):

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        ('workflows', '0012_the_queue'),
    ]

    operations = [
        migrations.CreateModel(
            name='ClientWebhook',
            fields=[
                ('owner', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='pilot_webhook', serialize=False, to=settings.AUTH_USER_MODEL)),
                ('url', models.CharField(blank=True, default='', max_length=2000)),
                ('secret', models.CharField(max_length=100)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                'verbose_name': 'client webhook',
            },
        ),
        migrations.AlterModelOptions(
            name='task',
            options={'permissions': [('cancel_task', 'Can cancel a task'), ('retry_task', 'Can retry a task'), ('view_all_tasks', "Can view every client's tasks"), ('resend_webhook', "Can re-send a task's completion webhook")]},
        ),
        migrations.AddField(
            model_name='task',
            name='callback_url',
            field=models.CharField(blank=True, db_default='', default='', max_length=2000),
        ),
        migrations.AddField(
            model_name='task',
            name='restarts',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='task',
            name='traceparent',
            field=models.CharField(blank=True, db_default='', default='', max_length=55),
        ),
        migrations.CreateModel(
            name='WebhookDelivery',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('task_state', models.CharField(max_length=20)),
                ('restarts', models.PositiveIntegerField()),
                ('url', models.CharField(max_length=2000)),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('delivered', 'Delivered'), ('failed', 'Failed')], default='pending', max_length=10)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('last_status', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True, default='')),
                ('attempt_log', models.JSONField(blank=True, default=list)),
                ('body', models.TextField(blank=True, null=True)),
                ('claim_token', models.PositiveBigIntegerField(default=0)),
                ('claimed_by', models.CharField(blank=True, default='', max_length=200)),
                ('claimed_until', models.DateTimeField(blank=True, null=True)),
                ('next_attempt_at', models.DateTimeField()),
                ('enqueued_at', models.DateTimeField(blank=True, null=True)),
                ('give_up_at', models.DateTimeField()),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('last_attempt_at', models.DateTimeField(blank=True, null=True)),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('task', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='workflows.task')),
            ],
            options={
                'verbose_name_plural': 'webhook deliveries',
                'indexes': [models.Index(condition=models.Q(('state', 'pending')), fields=['next_attempt_at'], name='delivery_due_idx')],
                'constraints': [models.UniqueConstraint(fields=('task', 'task_state', 'restarts'), name='delivery_task_event_uniq'), models.CheckConstraint(condition=models.Q(('state__in', ['pending', 'delivered', 'failed'])), name='delivery_state_valid_chk'), models.CheckConstraint(condition=models.Q(('task_state__in', ['succeeded', 'failed', 'cancelled'])), name='delivery_task_state_valid_chk')],
            },
        ),
        migrations.RunPython(grant, revoke),
    ]
