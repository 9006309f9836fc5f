"""System checks: refuse a configuration that would run a task twice.

django-q2's defaults redeliver a still-running task after `retry` seconds and
retry forever; PILOT's lease keeps that harmless only if the numbers agree.
"""

from django.conf import settings
from django.core.checks import Error, register


@register()
def pilot_execution_settings(app_configs, **kwargs):
    errors = []
    q = getattr(settings, "Q_CLUSTER", {})
    timeout, retry = q.get("timeout"), q.get("retry", 60)
    if not timeout:
        errors.append(Error(
            "Q_CLUSTER['timeout'] is not set: a hung worker would never be stopped.",
            hint="Set PILOT_TASK_TIMEOUT.", id="pilot.E001"))
    elif retry <= timeout:
        errors.append(Error(
            f"Q_CLUSTER['retry'] ({retry}s) must exceed Q_CLUSTER['timeout'] ({timeout}s), "
            "or django-q2 redelivers a task that is still running.",
            hint="Keep retry = timeout + a margin.", id="pilot.E002"))
    if not q.get("max_attempts"):
        errors.append(Error(
            "Q_CLUSTER['max_attempts'] is unbounded (0): django-q2 would redeliver a failing "
            "message forever. PILOT's dispatcher owns retries.",
            hint="Set max_attempts to 1.", id="pilot.E003"))
    lease, beat = settings.PILOT_LEASE_SECONDS, settings.PILOT_HEARTBEAT_SECONDS
    if lease < 2 * beat:
        errors.append(Error(
            f"PILOT_LEASE_SECONDS ({lease}) is shorter than twice PILOT_HEARTBEAT_SECONDS "
            f"({beat}): one late heartbeat would lose the lease of a healthy worker.",
            hint="Raise the lease or lower the heartbeat interval.", id="pilot.E004"))
    return errors
