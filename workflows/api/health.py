"""Liveness and readiness (no authentication; for load balancers and k8s).

/healthz answers 200 while the process serves requests. /readyz checks what a
request needs: the database (one `SELECT 1`) and the broker (Redis PING; with
the ORM broker the queue is the database) — 503 `unavailable` naming what is
down, so a balancer stops sending traffic until it is back.
"""

from __future__ import annotations

from django.db import DatabaseError, connection
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from workflows.api.problems import problem_response
from workflows.api.serializers import ProblemSerializer
from workflows.engine.enqueue import broker, uses_orm_broker

_Status = inline_serializer("HealthStatus", {"status": serializers.CharField(),
                                             "checks": serializers.DictField(required=False)})


class _Open(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]


class HealthzView(_Open):
    @extend_schema(operation_id="healthz", responses={200: _Status}, tags=["health"])
    def get(self, request):
        return Response({"status": "ok"})


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except DatabaseError:
        connection.close()  # let the next request reconnect
        return False


def _broker_ok() -> bool:
    try:
        return bool(broker().connection.ping())
    except Exception:  # noqa: BLE001 - any failure means "not ready"
        return False


class ReadyzView(_Open):
    @extend_schema(operation_id="readyz", tags=["health"], responses={
        200: _Status,
        (503, "application/problem+json"): OpenApiResponse(ProblemSerializer,
                                                           description="Problem: unavailable")})
    def get(self, request):
        checks = {"database": _database_ok()}
        checks["broker"] = checks["database"] if uses_orm_broker() else _broker_ok()
        if all(checks.values()):
            return Response({"status": "ok", "checks": checks})
        down = ", ".join(name for name, ok in checks.items() if not ok)
        response = problem_response(code="unavailable", status=503,
                                    title="Service unavailable",
                                    detail=f"Not ready: {down} unreachable",
                                    headers={"Retry-After": "2"})
        response.data["checks"] = checks
        return response
