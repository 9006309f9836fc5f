"""Create the database cache table when the default cache is the database.

The trigger throttle counts in the `default` cache, shared by every process;
without REDIS_URL that is a database table. Creating it in a migration means
`migrate` is the only set-up step a deployment needs.
"""

from django.core.management import call_command
from django.db import migrations


def create_cache_table(apps, schema_editor):
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


class Migration(migrations.Migration):
    dependencies = [("workflows", "0003_operators_group")]

    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop)]
