"""What a DEBUG page may show (DJANGO_DEBUG=true, as `make run` sets it).

A debug page is still a page: anyone who can reach the port reads it. So:

- `CredentialMaskingFilter` (DEFAULT_EXCEPTION_REPORTER_FILTER) masks, on the
  technical 500 page and in error e-mails, what Django's own filter leaves:
  the password inside any URL (`postgres://pilot:s3cret@db/pilot` ->
  `postgres://pilot:********@db/pilot`) and credential query parameters,
  wherever they appear — DATABASE_URL, REDIS_URL, CACHES' LOCATION,
  Q_CLUSTER['redis'], the environment in request.META, and the local
  variables of every frame (a database driver's frame holds its connection
  parameters).
- `PlainNotFoundMiddleware` answers a 404 with the production page instead of
  Django's technical one, which lists every URL pattern of the site.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.http import Http404
from django.urls import Resolver404, get_resolver
from django.views.debug import SafeExceptionReporterFilter
from django.views.defaults import page_not_found

MASK = "********"

# scheme://user:password@host — the password is everything between the first
# ':' of the user info and the last '@' before the host.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)[^/?#\s]*@")
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&;](?:password|passwd|pass|pwd|secret|token|api[_-]?key|key)=)[^&;#\s]*",
    re.IGNORECASE)


def mask_url_credentials(text: str) -> str:
    """`text` with the password of every URL in it, and credential query
    parameters, replaced by MASK."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['head']}{MASK}", text)


class CredentialMaskingFilter(SafeExceptionReporterFilter):
    """Django's filter (settings named like KEY/SECRET/PASS/TOKEN masked), plus
    URL credentials in every string, in settings, request.META and frame
    variables."""

    def cleanse_setting(self, key, value):
        value = super().cleanse_setting(key, value)
        if isinstance(value, str):
            return mask_url_credentials(value)
        return value

    def get_traceback_frame_variables(self, request, tb_frame):
        variables = super().get_traceback_frame_variables(request, tb_frame)
        return [(name, self.cleanse_setting(name, value)) for name, value in variables]


class PlainNotFoundMiddleware:
    """Under DEBUG, a URL that matches nothing, or a view's Http404, gets the
    production 404 page (handler404's default) rather than the technical page
    and its list of every route. Place it after CommonMiddleware, whose
    APPEND_SLASH redirect still sees the 404. Without DEBUG it does nothing:
    Django already answers plainly."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if settings.DEBUG:
            try:
                get_resolver(getattr(request, "urlconf", None)).resolve(request.path_info)
            except Resolver404 as exc:
                return page_not_found(request, exc)
        return self.get_response(request)

    def process_exception(self, request, exception):
        if settings.DEBUG and isinstance(exception, Http404):
            return page_not_found(request, exception)
        return None
