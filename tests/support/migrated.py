"""Rows that data migrations write, written again for a test that checks them.

Migrating a test database writes them once (the operators group, the daily
cleanup schedule), but a transactional test's flush empties every table and
brings back only what post_migrate makes (permissions, content types). Which
tests ran before on the same database depends on how the suite is split over
workers (`make test` runs two), so a test that checks such rows rebuilds them
with the migrations' own forward functions first.
"""

from __future__ import annotations

from types import SimpleNamespace

from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations import RunPython

# The migrations that build the "operators" group and grant it its permissions.
OPERATORS_MIGRATIONS = ("0003_operators_group", "0006_operators_trigger", "0009_pilot_schedule",
                        "0013_webhooks_and_trace_context", "0021_waiting")


def rebuild(*names: str, app: str = "workflows") -> None:
    """Runs the RunPython operations of `app`'s migrations `names`, in order, with
    the models as of the last of them (what they touch -- auth, contenttypes and
    django_q's models -- is the same at each). The caller first deletes the rows,
    as a reverse migration would."""
    _run(names, app=app, backwards=False)


def unbuild(*names: str, app: str = "workflows") -> None:
    """Runs the reverse functions of those RunPython operations, last first, as
    `migrate app <before names[0]>` would."""
    _run(names, app=app, backwards=True)


def _run(names, *, app, backwards):
    loader = MigrationLoader(connection)
    apps = loader.project_state((app, names[-1])).apps
    # Data migrations use only the schema editor's connection.
    editor = SimpleNamespace(connection=connection)
    operations = [operation for name in names
                  for operation in loader.get_migration(app, name).operations
                  if isinstance(operation, RunPython)]
    for operation in reversed(operations) if backwards else operations:
        (operation.reverse_code if backwards else operation.code)(apps, editor)
