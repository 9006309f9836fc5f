"""`GET /metrics`: the Prometheus scrape endpoint (docs/design.md, "Observability").

Open unless PILOT_METRICS_TOKEN is set; then it wants `Authorization: Bearer
<token>`. Needs no session or database for the event metrics, so it answers
during a database outage too (with pilot_database_up 0).
"""

from __future__ import annotations

import hmac

from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from workflows.conf import pilot_settings
from workflows.observability.metrics import exposition


def token_authorized(authorization: str) -> bool:
    """Whether an Authorization header value may read the metrics."""
    token = pilot_settings.PILOT_METRICS_TOKEN
    if not token:
        return True
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              token.encode())


@require_GET
def metrics_view(request):
    if not token_authorized(request.headers.get("Authorization", "")):
        response = HttpResponse("a bearer token is required\n", status=401,
                                content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
