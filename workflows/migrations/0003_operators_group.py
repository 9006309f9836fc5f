"""The "operators" group: see every task and its history, cancel, retry.

Permissions are created by the post_migrate signal, which runs after all
migrations; create them here first so this works on a fresh database.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

OPERATOR_PERMISSIONS = [
    ("workflows", "view_task"),
    ("workflows", "view_all_tasks"),
    ("workflows", "cancel_task"),
    ("workflows", "retry_task"),
    ("workflows", "view_stepcheckpoint"),
    ("workflows", "view_tasktransition"),
]


def create_operators(apps, schema_editor):
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name="operators")
    for app_label, codename in OPERATOR_PERMISSIONS:
        group.permissions.add(Permission.objects.get(content_type__app_label=app_label,
                                                     codename=codename))


def remove_operators(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name="operators").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0002_task_replay"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_operators, remove_operators)]
