"""`GET /metrics`: the Prometheus scrape endpoint (docs/design.md, "Observability").

With PILOT_METRICS_TOKEN set it wants `Authorization: Bearer <token>`.
Without one it is closed (403), except under DEBUG (`make run`) or when the
project opens it on purpose (PILOT_METRICS_PUBLIC: a scraper-only network):
the page shows workflow names and task counts, which a host's public domain
must not hand to anyone who asks (docs/security.md). Needs no session or
database for the event metrics, so it answers during a database outage too
(with pilot_database_up 0).
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from workflows.conf import pilot_settings
from workflows.observability.metrics import exposition

CLOSED = ("/metrics is closed: set PILOT_METRICS_TOKEN (and send Authorization: Bearer "
          "<token>), or PILOT_METRICS_PUBLIC=true if only your scraper can reach it\n")


def metrics_open() -> bool:
    """Whether /metrics answers without a token: no token is set, and DEBUG or
    PILOT_METRICS_PUBLIC says so."""
    return not pilot_settings.PILOT_METRICS_TOKEN and bool(
        settings.DEBUG or pilot_settings.PILOT_METRICS_PUBLIC)


def token_authorized(authorization: str) -> bool:
    """Whether an Authorization header value may read the metrics."""
    token = pilot_settings.PILOT_METRICS_TOKEN
    if not token:
        return metrics_open()
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              token.encode())


@require_GET
def metrics_view(request):
    if not token_authorized(request.headers.get("Authorization", "")):
        if not pilot_settings.PILOT_METRICS_TOKEN:
            return HttpResponse(CLOSED, status=403, content_type="text/plain")
        response = HttpResponse("a bearer token is required\n", status=401,
                                content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
