"""The "operators" group: see every task and its history, cancel, retry.

Permissions are created by the post_migrate signal, which runs after all
migrations; create them here first so this works on a fresh database.

A host project may have a group of that name already: PILOT then adds its
permissions to it, and records that the group is not its own, so that
reversing (`migrate workflows zero`) takes back only the permissions PILOT
added and never deletes a group PILOT did not create (docs/embedding.md,
"Uninstalling"). The record is one row of `pilot_created_group`, a table
that lives exactly as long as this migration is applied. A database that
applied this migration before the record existed has none: there the group
is deleted only if PILOT's permissions were all it had.
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
GROUP = "operators"
LEDGER = "pilot_created_group"  # (name, group_id): group_id NULL when the group was the host's


def _permissions(Permission):
    return [Permission.objects.get(content_type__app_label=app_label, codename=codename)
            for app_label, codename in OPERATOR_PERMISSIONS]


def create_operators(apps, schema_editor):
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, created = Group.objects.get_or_create(name=GROUP)
    group.permissions.add(*_permissions(Permission))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {LEDGER} "
                       "(name varchar(150) PRIMARY KEY, group_id integer NULL)")
        cursor.execute(f"DELETE FROM {LEDGER} WHERE name = %s", [GROUP])
        cursor.execute(f"INSERT INTO {LEDGER} (name, group_id) VALUES (%s, %s)",
                       [GROUP, group.pk if created else None])


def remove_operators(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    connection = schema_editor.connection
    recorded = None  # no record: applied before there was one
    if LEDGER in connection.introspection.table_names():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT group_id FROM {LEDGER} WHERE name = %s", [GROUP])
            row = cursor.fetchone()
            recorded = row[0] if row else 0
            cursor.execute(f"DROP TABLE {LEDGER}")
    group = Group.objects.filter(name=GROUP).first()
    if group is None:
        return
    group.permissions.remove(*_permissions(Permission))
    ours = (not group.permissions.exists()) if recorded is None else recorded == group.pk
    if ours:
        group.delete()


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0002_task_replay"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_operators, remove_operators)]
