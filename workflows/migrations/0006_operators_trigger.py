"""Operators may also trigger workflows by hand from the console — part of an
operator's job beside cancel and retry (docs/design.md, "Who may do what") —
which needs workflows.add_task."""

from django.db import migrations

ADDED_PERMISSIONS = [("workflows", "add_task")]


def grant(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group = Group.objects.filter(name="operators").first()
    if group is not None:
        group.permissions.add(*[Permission.objects.get(content_type__app_label=app_label,
                                                       codename=codename)
                                for app_label, codename in ADDED_PERMISSIONS])


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group = Group.objects.filter(name="operators").first()
    if group is not None:
        group.permissions.remove(*[Permission.objects.get(content_type__app_label=app_label,
                                                          codename=codename)
                                   for app_label, codename in ADDED_PERMISSIONS])


class Migration(migrations.Migration):
    dependencies = [("workflows", "0005_cleanup_schedule")]

    operations = [migrations.RunPython(grant, revoke)]
