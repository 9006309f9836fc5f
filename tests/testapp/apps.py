import os
from datetime import timedelta

from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "pilot_testapp"

    def ready(self):
        # A process whose own clock is wrong (tests/acceptance/test_clock_skew.py):
        # Django's idea of "now" in this process is off by the given seconds.
        skew = float(os.environ.get("PILOT_TEST_CLOCK_SKEW_SECONDS") or 0)
        if skew:
            from django.utils import timezone

            real = timezone.now
            timezone.now = lambda: real() + timedelta(seconds=skew)
        # A slow resolver for some names (tests/support/slow_dns.py): the attempts'
        # deadline includes the DNS lookup (tests/acceptance/test_fairness.py).
        slow_dns = os.environ.get("PILOT_TEST_SLOW_DNS")
        if slow_dns:
            from tests.support.slow_dns import install

            install(slow_dns)
