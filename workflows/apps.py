from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"
    verbose_name = "PILOT workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.models.signals import post_migrate

        # Imported for their side effects: checks, signals, the schedules' admin.
        from workflows import checks  # noqa: F401
        from workflows.admin import django_q, guard, schedules, webhooks  # noqa: F401
        from workflows.engine import schedules_sync_after_migrate
        from workflows.observability import metrics
        from workflows.registry import autodiscover

        autodiscover()
        metrics.install()
        # After the admin's autodiscovery (django.contrib.admin is ready first).
        # The login guard's receivers and login form: the opt-in app
        # workflows.login_guard.
        django_q.install()  # django-q2's Schedule admin cannot run arbitrary callables
        guard.guard_stock_admins()  # no lookup on a password hash, no NUL reaching SQL
        # Schedules declared in code are written when the database is migrated
        # (every deploy), like Django's permissions; see schedule_definitions.
        post_migrate.connect(schedules_sync_after_migrate, sender=self,
                             dispatch_uid="pilot_schedules_sync")
