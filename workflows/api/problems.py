"""Errors as RFC 9457 problem details — the one place the API maps them.

Every error response is `application/problem+json`:

    {"type": "https://pilot.dev/problems/<code>", "title": ..., "status": ...,
     "detail": ..., "code": "<code>", "errors": {...}?}

`code` is stable and machine-readable; clients branch on it, never on text.
Domain errors (`workflows.rules.errors.PilotError`) carry their own code and status;
DRF's and Django's are given one here; a database outage is a 503
`unavailable`; anything unexpected is logged and answered with a bare 500
problem — never a stack trace.
"""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf
from rest_framework.response import Response

from workflows.api.throttling import RateLimited
from workflows.rules.errors import PilotError, Unavailable, plain_errors

log = logging.getLogger("pilot.api")

PROBLEM_CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "https://pilot.dev/problems/"

# DRF exception -> (code, title)
_DRF = {
    drf.NotAuthenticated: ("not_authenticated", "Authentication required"),
    drf.AuthenticationFailed: ("not_authenticated", "Authentication failed"),
    drf.PermissionDenied: ("permission_denied", "Permission denied"),
    drf.NotFound: ("not_found", "Not found"),
    drf.MethodNotAllowed: ("method_not_allowed", "Method not allowed"),
    drf.NotAcceptable: ("not_acceptable", "Not acceptable"),
    drf.UnsupportedMediaType: ("unsupported_media_type", "Unsupported media type"),
    drf.Throttled: ("throttled", "Too many requests"),
    drf.ParseError: ("parse_error", "Malformed request body"),
    drf.ValidationError: ("validation_error", "Invalid request"),
}


def problem_body(*, code: str, status: int, title: str, detail: str,
                 errors=None) -> dict:
    body = {"type": TYPE_BASE + code, "title": title, "status": status, "detail": detail,
            "code": code}
    if errors is not None:
        body["errors"] = errors
    return body


def problem_response(*, code: str, status: int, title: str, detail: str, errors=None,
                     headers: dict | None = None) -> Response:
    return Response(problem_body(code=code, status=status, title=title, detail=detail,
                                 errors=errors),
                    status=status, headers=headers, content_type=PROBLEM_CONTENT_TYPE)


def pilot_error_response(exc: PilotError, headers: dict | None = None) -> Response:
    return problem_response(code=exc.code, status=exc.http_status, title=exc.title,
                            detail=exc.detail, errors=exc.errors, headers=headers)


def pilot_error_dict(exc: PilotError) -> dict:
    return problem_body(code=exc.code, status=exc.http_status, title=exc.title,
                        detail=exc.detail, errors=exc.errors)


def _detail_text(detail) -> str:
    if isinstance(detail, (list, tuple)):
        return "; ".join(_detail_text(d) for d in detail)
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_detail_text(v)}" for k, v in detail.items())
    return str(detail)


# SQLSTATE read_only_sql_transaction: PostgreSQL refused a write because the
# transaction is read-only — a standby, or default_transaction_read_only.
_READ_ONLY_SQLSTATE = "25006"


def database_read_only(exc: BaseException) -> bool:
    """Whether `exc` is a database's refusal to write because it is read-only."""
    if not isinstance(exc, DatabaseError):
        return False
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) == _READ_ONLY_SQLSTATE or (
        "readonly database" in str(exc))  # SQLite: "attempt to write a readonly database"


def _database_unavailable(exc) -> Response | None:
    """A 503 for a database that cannot take the request now; None for any
    other error (database errors that are bugs stay 500s)."""
    if database_read_only(exc):
        # A standby after a failover (or default_transaction_read_only): no
        # write can succeed here until the node reaches a primary again.
        log.warning("database read-only: %s", exc)
        return pilot_error_response(Unavailable("The database is read-only (a standby?); "
                                                "retry shortly"), headers={"Retry-After": "2"})
    if isinstance(exc, (OperationalError, InterfaceError)):
        # Connection-level failures: the database is down or restarting.
        log.warning("database unavailable: %s", exc)
        return pilot_error_response(Unavailable("The database is unavailable; retry shortly"),
                                    headers={"Retry-After": "2"})
    return None


def problem_exception_handler(exc, context):
    """DRF's EXCEPTION_HANDLER: every exception raised in an API view becomes a
    problem response."""
    if isinstance(exc, PilotError):
        return pilot_error_response(exc)
    if isinstance(exc, Http404):
        exc = drf.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        return problem_response(code="payload_too_large", status=413, title="Payload too large",
                                detail="The request body is too large")
    if isinstance(exc, drf.APIException):
        code, title = next(((c, t) for cls, (c, t) in _DRF.items() if isinstance(exc, cls)),
                           (exc.default_code, "Request failed"))
        headers = {}
        if isinstance(exc, drf.Throttled) and exc.wait is not None:
            headers["Retry-After"] = str(max(1, int(exc.wait + 0.999)))
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if isinstance(exc, drf.ValidationError):
            errors = plain_errors(exc.detail)
            if not isinstance(errors, dict):
                errors = {"non_field_errors": errors}
            return problem_response(code=code, status=400, title=title,
                                    detail="The request is not valid; see errors",
                                    errors=errors)
        detail = _detail_text(exc.detail)
        if isinstance(exc, drf.Throttled) and not isinstance(exc, RateLimited):
            detail = "Rate limit exceeded; retry after the number of seconds in Retry-After"
        return problem_response(code=code, status=exc.status_code, title=title, detail=detail,
                                headers=headers)
    unavailable = _database_unavailable(exc)
    if unavailable is not None:
        return unavailable
    log.exception("unhandled error in %s", context.get("view").__class__.__name__)
    return problem_response(code="internal_error", status=500, title="Internal error",
                            detail="An unexpected error occurred; it has been logged")


# --- outside DRF views (URL resolution, Django's handlers) ----------------------------------

def json_problem(*, code: str, status: int, title: str, detail: str) -> JsonResponse:
    return JsonResponse(problem_body(code=code, status=status, title=title, detail=detail),
                        status=status, content_type=PROBLEM_CONTENT_TYPE)


@csrf_exempt  # a POST to no route is a 404, not a CSRF failure
def api_not_found(request, *args, **kwargs):
    """Any /api/ path that matches no route."""
    return json_problem(code="not_found", status=404, title="Not found",
                        detail=f"No API route for {request.method} {request.path}")
