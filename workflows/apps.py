from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"
    verbose_name = "PILOT workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from workflows import checks, login_forms, login_guard, qadmin  # noqa: F401
        from workflows.observability import metrics
        from workflows.registry import autodiscover

        autodiscover()
        metrics.install()
        # After the admin's autodiscovery (django.contrib.admin is ready first):
        login_forms.install()  # the login form says why the login guard refused
        qadmin.install()  # django-q2's Schedule admin cannot run arbitrary callables
