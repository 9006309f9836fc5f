from django.apps import AppConfig

TASK_BACKEND = "workflows.django_tasks.PilotTaskBackend"


class WorkflowsConfig(AppConfig):
    name = "workflows"
    verbose_name = "PILOT workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.models.signals import post_migrate

        # Imported for their side effects: checks, signals, the schedules' admin.
        from workflows import checks  # noqa: F401
        from workflows.admin import django_q, fleet_webhooks, guard, schedules, webhooks  # noqa: F401
        from workflows.engine import schedules_sync_after_migrate
        from workflows.observability import metrics
        from workflows.registry import autodiscover

        autodiscover()
        metrics.install()
        _connect_django_tasks()
        # After the admin's autodiscovery (django.contrib.admin is ready first).
        # The login guard's receivers and login form: the opt-in app
        # workflows.login_guard.
        django_q.install()  # django-q2's Schedule admin cannot run arbitrary callables
        guard.guard_stock_admins()  # no lookup on a password hash, no NUL reaching SQL
        # Schedules declared in code are written when the database is migrated
        # (every deploy), like Django's permissions; see schedule_definitions.
        post_migrate.connect(schedules_sync_after_migrate, sender=self,
                             dispatch_uid="pilot_schedules_sync")


def pilot_task_backend_alias() -> str | None:
    """The alias of the first PilotTaskBackend in settings.TASKS, or None
    (read without importing Django's task framework, which 5.2 lacks)."""
    from django.conf import settings

    for alias, conf in (getattr(settings, "TASKS", None) or {}).items():
        if isinstance(conf, dict) and conf.get("BACKEND") == TASK_BACKEND:
            return str(alias)
    return None


def _connect_django_tasks() -> None:
    """With a PilotTaskBackend in TASKS, hook it in now (workflows/django_tasks.py):
    a worker that never imported a task's module must still find its workflow and
    send the framework's signals from its first claim on."""
    if pilot_task_backend_alias() is not None:
        from workflows import django_tasks

        django_tasks.connect()
