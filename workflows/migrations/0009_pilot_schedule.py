"""Schedules: periodic, idempotent triggers of a workflow (PilotSchedule), and
the operators' right to manage them in the console (operators steer everything
periodic that upstream systems do not)."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.contrib.auth.management import create_permissions
from django.db import migrations, models

SCHEDULE_PERMISSIONS = ["view_pilotschedule", "add_pilotschedule", "change_pilotschedule",
                        "delete_pilotschedule"]


def _schedule_permissions(apps):
    # Permissions are created after all migrations (post_migrate); create this
    # model's now so that the grant works on a fresh database.
    app_config = apps.get_app_config("workflows")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    Permission = apps.get_model("auth", "Permission")
    return list(Permission.objects.filter(content_type__app_label="workflows",
                                          codename__in=SCHEDULE_PERMISSIONS))


def grant(apps, schema_editor):
    group = apps.get_model("auth", "Group").objects.filter(name="operators").first()
    if group is not None:
        group.permissions.add(*_schedule_permissions(apps))


def revoke(apps, schema_editor):
    group = apps.get_model("auth", "Group").objects.filter(name="operators").first()
    if group is not None:
        group.permissions.remove(*_schedule_permissions(apps))


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0008_cache_table_whatever_the_broker'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='PilotSchedule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100)),
                ('workflow', models.CharField(max_length=100)),
                ('payload', models.JSONField(blank=True, default=dict)),
                ('cron', models.CharField(max_length=200)),
                ('missed', models.CharField(choices=[('skip', 'skip: missed slots do not run'), ('run_once', 'run_once: one run for the latest missed slot'), ('catch_up', 'catch_up: every missed slot runs (at most 100)')], default='skip', max_length=10)),
                ('enabled', models.BooleanField(default=True)),
                ('origin', models.CharField(choices=[('operator', 'operator (admin or schedule_workflow)'), ('code', 'code (define_workflow(schedule=...))')], default='operator', max_length=10)),
                ('next_slot_at', models.DateTimeField(blank=True, null=True)),
                ('last_fired_slot', models.DateTimeField(blank=True, null=True)),
                ('last_fired_at', models.DateTimeField(blank=True, null=True)),
                ('last_task_id', models.UUIDField(blank=True, null=True)),
                ('fired_count', models.PositiveIntegerField(default=0)),
                ('last_error', models.TextField(blank=True, default='')),
                ('last_error_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('owner', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='pilot_schedules', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name': 'schedule',
                'ordering': ['name'],
                'indexes': [models.Index(condition=models.Q(('enabled', True)), fields=['next_slot_at'], name='schedule_due_idx')],
                'constraints': [models.UniqueConstraint(fields=('name',), name='schedule_name_uniq'), models.CheckConstraint(condition=models.Q(('missed__in', ['skip', 'run_once', 'catch_up'])), name='schedule_missed_valid_chk'), models.CheckConstraint(condition=models.Q(('origin__in', ['operator', 'code'])), name='schedule_origin_valid_chk')],
            },
        ),
        migrations.RunPython(grant, revoke),
    ]
