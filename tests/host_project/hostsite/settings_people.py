"""The host project with an email-login user model of its own (no `username`)
and PILOT's API under a deeper path (hostsite/urls_people.py)."""

from hostsite.settings import *  # noqa: F403
from hostsite.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "people"]
AUTH_USER_MODEL = "people.User"
ROOT_URLCONF = "hostsite.urls_people"
