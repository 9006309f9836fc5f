"""Create `pilot_cache` where 0004 did not.

Until 0004 named the table itself, it created it only when the default cache
was the database cache, i.e. when `migrate` ran without REDIS_URL. A database
migrated with REDIS_URL set has no table; run without REDIS_URL later, every
cache call failed. This creates it there (and does nothing where it exists).
"""

from django.core.management import call_command
from django.db import migrations

CACHE_TABLE = "pilot_cache"  # LOCATION of the database cache in pilot/settings.py


def create_cache_table(apps, schema_editor):
    call_command("createcachetable", CACHE_TABLE, database=schema_editor.connection.alias,
                 verbosity=0)


class Migration(migrations.Migration):
    dependencies = [("workflows", "0007_compensation_phase")]

    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop)]
