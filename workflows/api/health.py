"""Liveness and readiness (no authentication; for load balancers and k8s).

/healthz answers 200 while the process serves requests.

/readyz answers "can this web node accept triggers?" A trigger needs the
database, and one that takes writes: without it, or while it is read-only (a
PostgreSQL standby after a failover, or `default_transaction_read_only` on),
503 `unavailable` (`"database": "read-only"` in `degraded`). It does not need the
broker — a task committed while Redis is down is enqueued by the dispatcher
once it is back — nor a reachable cache (the rate limits degrade, logged), so
those are reported in the body as degraded details with a 200, and a load
balancer does not pull every node for a Redis outage. One exception: a
*misconfigured* cache (the table missing, Redis refusing the credentials) makes
every trigger a 503 (rate limits fail closed, workflows.observability.shared_cache), so
readiness says so too.

    200 {"status": "ok"|"degraded", "checks": {"database": true, "broker": true,
         "cache": true}, "degraded": {"broker": "unreachable"}}

The body says only "unreachable" or "misconfigured" (the endpoint is open:
no host names or error texts); the error itself is logged as
`readiness_degraded` (WARNING) with the component and the error.

Both answer whatever the Host header (ProbeMiddleware), so a probe may address
the node by IP.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from workflows.api.base import PilotAPIView, documented
from workflows.api.problems import pilot_error_response
from workflows.api.serializers import ProblemSerializer
from workflows.database import database_state
from workflows.engine import uses_orm_broker
from workflows.observability.events import Event, emit
from workflows.observability.shared_cache import cache_probe, describe
from workflows.rules.errors import Unavailable

_Status = inline_serializer("HealthStatus", {
    "status": serializers.CharField(),
    "checks": serializers.DictField(child=serializers.BooleanField(), required=False),
    "degraded": serializers.DictField(child=serializers.CharField(), required=False)})

# Readiness must answer within a probe's timeout even when Redis stops answering.
PROBE_TIMEOUT_SECONDS = 1.0


class _Open(PilotAPIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]


class HealthzView(_Open):
    @documented(operation_id="healthz", responses={200: _Status}, tags=["health"])
    def get(self, request):
        return Response({"status": "ok"})


def _database_state() -> str:
    """"ok", "read-only" (every transaction would refuse a write: a standby, or
    `default_transaction_read_only`) or "unreachable". One statement."""
    return database_state()


_broker_clients: dict = {}


def _broker_error() -> str:
    """"" when the Redis broker answers PING, else the error."""
    import redis

    # A URL, or django-q2's dict of Redis() arguments (the broker is the main
    # configuration's, whichever cluster PILOT's is: workflows.cluster).
    config: Any = settings.Q_CLUSTER["redis"]
    timeouts: dict[str, Any] = {"socket_connect_timeout": PROBE_TIMEOUT_SECONDS,
                "socket_timeout": PROBE_TIMEOUT_SECONDS}
    try:
        key = repr(config)
        client = _broker_clients.get(key)
        if client is None:
            client = _broker_clients[key] = (
                redis.Redis.from_url(config, **timeouts) if isinstance(config, str)
                else redis.Redis(**{**config, **timeouts}))
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "degraded"
        return describe(exc)
    return ""


class ReadyzView(_Open):
    @documented(operation_id="readyz", tags=["health"], responses={
        200: _Status,
        (503, "application/problem+json"): OpenApiResponse(ProblemSerializer,
                                                           description="Problem: unavailable")})
    def get(self, request):
        database_state = _database_state()
        database = database_state == "ok"
        degraded: dict[str, str] = {}
        if database_state == "read-only":
            degraded["database"] = "read-only"
            emit(Event.READINESS_DEGRADED, level=logging.WARNING, component="database",
                 state="read-only", error="transaction_read_only is on")
        if not uses_orm_broker():
            error = _broker_error()
            if error:
                degraded["broker"] = "unreachable"
                emit(Event.READINESS_DEGRADED, level=logging.WARNING, component="broker",
                     state="unreachable", error=error)
        cache_state, error = cache_probe()
        if cache_state != "ok":
            degraded["cache"] = cache_state
            emit(Event.READINESS_DEGRADED, level=logging.WARNING, component="cache",
                 state=cache_state, error=error)
        checks = {"database": database,
                  "broker": (database_state != "unreachable") if uses_orm_broker()
                  else "broker" not in degraded,
                  "cache": cache_state == "ok"}
        down = [name for name, ok in (("database", database),
                                      ("cache", cache_state != "misconfigured")) if not ok]
        if down:
            detail = ", ".join(
                f"database {database_state}" if name == "database" else "cache misconfigured"
                for name in down)
            response = pilot_error_response(Unavailable(f"Not ready: {detail}"),
                                            headers={"Retry-After": "2"})
            response.data["checks"] = checks
            response.data["degraded"] = degraded
            return response
        body = {"status": "degraded" if degraded else "ok", "checks": checks}
        if degraded:
            body["degraded"] = degraded
        return Response(body)
