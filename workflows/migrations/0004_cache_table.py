"""Create the shared cache's table, `pilot_cache`.

The rate limits and login lockouts count in the `default` cache, shared by
every process; without REDIS_URL that is this table. It is created whatever
the broker: a deployment migrated with REDIS_URL set and later run without it
must find its table, not a cache that fails on every call. Creating it in a
migration means `migrate` is the only set-up step a deployment needs.
"""

from django.core.management import call_command
from django.db import migrations

CACHE_TABLE = "pilot_cache"  # LOCATION of the database cache in pilot/settings.py


def create_cache_table(apps, schema_editor):
    # Named explicitly, so it does not depend on what CACHES says today.
    call_command("createcachetable", CACHE_TABLE, database=schema_editor.connection.alias,
                 verbosity=0)


class Migration(migrations.Migration):
    dependencies = [("workflows", "0003_operators_group")]

    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop)]
