"""`workflows.schedule_as_owner` (issue 31, N3; docs/schedules.md, "Owners"): who
may save a schedule in the console that runs as another user than the
scheduler user. Granted to no group: the operators group keeps adding and
changing schedules that run as the scheduler user.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0019_secrets_sealed_and_rotation_overlap'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='pilotschedule',
            options={'ordering': ['name'], 'permissions': [('schedule_as_owner', 'Can create or change a schedule that runs as another user')], 'verbose_name': 'schedule'},
        ),
    ]
