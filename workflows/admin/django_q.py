"""django-q2's Schedule admin, locked down.

django-q2 registers an admin for its `Schedule` model in which anyone with
`django_q.add_schedule` (every superuser) may type any dotted path as `func`
(or `hook`) with any arguments: `os.system` with `"curl … | sh"` runs on every
worker machine. One compromised admin account would be a shell on the fleet.

PILOT offers no arbitrary-callable scheduling. `LockedScheduleAdmin` replaces
django-q2's: nobody can add a schedule in the admin, and on an existing one
(PILOT's own `pilot.cleanup_tasks`, migration 0005, or one a deployment
created in code) only the timing can change — `schedule_type`, `minutes`,
`repeats` (0 disables it), `next_run`, `cron`. What runs (`func`, `args`,
`kwargs`, `hook`) and where (`cluster`) is read-only for everyone, superusers
included. Deleting stays possible (a deployment may prefer cron to run
`cleanup_tasks`). New schedules are code: a data migration, like 0005.

`install()` runs from WorkflowsConfig.ready(), after the admin's autodiscovery
registered django-q2's admin. Every django-q2 list takes only its own filters'
parameters (`workflows.admin.guard`). With PILOT_ADMIN_BRANDING its index
section is named for what it is (`name_the_section`): the queue library's
own records, not PILOT's schedules or failed tasks.
"""

from __future__ import annotations

from django.contrib import admin
from django_q.admin import FailAdmin, QueueAdmin, ScheduleAdmin, TaskAdmin
from django_q.models import Failure, OrmQ, Schedule, Success

from workflows.admin.guard import GuardedChangelist, guarded
from workflows.conf import pilot_settings

# The only Schedule fields the admin may change: when, never what.
TIMING_FIELDS = ("schedule_type", "minutes", "repeats", "next_run", "cron")


class LockedScheduleAdmin(GuardedChangelist, ScheduleAdmin):
    def has_add_permission(self, request):
        return False

    def get_readonly_fields(self, request, obj=None):
        # Every field but the timing ones, including any a later django-q2 adds.
        return [f.name for f in Schedule._meta.fields
                if f.name not in TIMING_FIELDS and not f.primary_key]


# django-q2's section of the admin index, renamed where the console is branded:
# its "Scheduled tasks" and "Failed tasks" sat beside PILOT's Schedules and
# failed tasks with nothing to say which is which.
DJANGO_Q_SECTION = "Django Q internals (the queue library's own records, not PILOT's tasks)"


def name_the_section(branded: bool) -> None:
    if branded:
        from django.apps import apps

        apps.get_app_config("django_q").verbose_name = DJANGO_Q_SECTION


def install(site=admin.site) -> None:
    name_the_section(pilot_settings.PILOT_ADMIN_BRANDING)
    if site.is_registered(Schedule):
        site.unregister(Schedule)
    site.register(Schedule, LockedScheduleAdmin)
    # django-q2's other lists take only their own filters' parameters too
    # (workflows.admin.guard): `?func=%00` was a 500.
    for model, stock in ((Success, TaskAdmin), (Failure, FailAdmin), (OrmQ, QueueAdmin)):
        if type(site._registry.get(model)) is stock:
            site.unregister(model)
            site.register(model, guarded(stock))
