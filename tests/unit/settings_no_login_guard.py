"""The suite's settings as a host without PILOT's opt-in login guard has them."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, MIDDLEWARE

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "workflows.login_guard"]
MIDDLEWARE = [m for m in MIDDLEWARE if m != "workflows.accounts.login_guard.LoginDeviceMiddleware"]
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
