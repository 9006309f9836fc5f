from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"
    verbose_name = "PILOT workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from workflows import checks, login_guard  # noqa: F401  (register checks, signals)
        from workflows.observability import metrics
        from workflows.registry import autodiscover

        autodiscover()
        metrics.install()
