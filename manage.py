#!/usr/bin/env python
"""Django's command-line utility for PILOT.

From a `make run` checkout it just works: with PILOT's settings (or a
`local_settings.py` beside this file), none of DJANGO_SECRET_KEY, DJANGO_DEBUG
set and the database SQLite (DATABASE_URL unset, or sqlite://),
it takes `make run`'s local profile (DJANGO_DEBUG=true, PILOT_DEMO_WORKFLOWS=true,
PILOT_LOG_FORMAT=text, as bin/run-local sets them). SQLite is for evaluating PILOT, never production
(docs/operations.md, "SQLite's limits"); a deployment on PostgreSQL without a
secret key is still refused — in one line that names the fix, not a traceback.
"""

import os
import sys

# What bin/run-local exports for `make run`'s processes (the ones manage.py needs).
LOCAL_PROFILE = {"DJANGO_DEBUG": "true", "PILOT_DEMO_WORKFLOWS": "true",
                 "PILOT_LOG_FORMAT": "text"}


def local_profile(environ) -> dict[str, str]:
    """The variables to add for a `make run` checkout; {} anywhere else."""
    database = environ.get("DATABASE_URL", "sqlite://")
    if ("DJANGO_SECRET_KEY" in environ or "DJANGO_DEBUG" in environ
            or not database.startswith("sqlite:")):
        return {}
    return {k: v for k, v in LOCAL_PROFILE.items() if k not in environ}


def checkout_settings(module: str) -> bool:
    """PILOT's settings, or a settings module of the checkout's own beside this file
    (`local_settings.py`, ignored by git: docs/writing-workflows.md)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return module == "pilot.settings" or (
        "." not in module and os.path.isfile(os.path.join(here, f"{module}.py")))


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pilot.settings")
    if checkout_settings(os.environ["DJANGO_SETTINGS_MODULE"]):
        os.environ.update(local_profile(os.environ))
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        from django.conf import settings

        settings.INSTALLED_APPS  # noqa: B018  # reads the settings: a refusal is raised here
    except ImproperlyConfigured as refused:
        sys.exit(f"manage.py: {refused}")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
