"""Typed errors: one class per problem `code` the PILOT API returns.

Every error response of the API is RFC 9457 problem+json with a stable `code`;
`error_from_problem` turns it into the matching exception, so callers write

    try:
        client.trigger("acme.sync", payload)
    except pilot_client.IdempotencyKeyReused as exc:
        ...  # exc.code, exc.status, exc.detail, exc.problem

A code this version does not know (a newer server) still raises
`PilotAPIError` with that code: branch on `.code` for forward compatibility.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class PilotError(Exception):
    """Anything the client raises on purpose."""


class PilotAPIError(PilotError):
    """The server answered with an error (problem+json, or a bare HTTP error).

    `code` is the stable machine-readable code, `status` the HTTP status,
    `detail` the human explanation, `problem` the whole problem document,
    `errors` the per-field messages of a validation error (or None)."""

    code: str = "error"
    status: int = 0

    def __init__(self, detail: str = "", *, code: str | None = None, status: int | None = None,
                 problem: Mapping[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None):
        self.problem: dict = dict(problem or {})
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.detail = detail or self.problem.get("detail") or self.problem.get("title") or self.code
        self.title = self.problem.get("title", "")
        self.errors = self.problem.get("errors")
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        super().__init__(f"{self.status} {self.code}: {self.detail}")


# --- one class per code (SPEC'd codes of /api/v1; kept in step with the server by a test) ---

class NotAuthenticated(PilotAPIError):
    """401: no token, or a wrong one."""
    code, status = "not_authenticated", 401


class PermissionDenied(PilotAPIError):
    """403: the token's client may not do this (e.g. trigger without workflows.add_task)."""
    code, status = "permission_denied", 403


class NotFound(PilotAPIError):
    """404: no such task for this client (another client's task is not found either)."""
    code, status = "not_found", 404


class MethodNotAllowed(PilotAPIError):
    code, status = "method_not_allowed", 405


class NotAcceptable(PilotAPIError):
    code, status = "not_acceptable", 406


class UnsupportedMediaType(PilotAPIError):
    code, status = "unsupported_media_type", 415


class ParseError(PilotAPIError):
    """400: the body is not valid JSON."""
    code, status = "parse_error", 400


class ValidationError(PilotAPIError):
    """400: the request (or the payload, for the workflow) is not valid; see `.errors`."""
    code, status = "validation_error", 400


class IdempotencyKeyMissing(PilotAPIError):
    code, status = "idempotency_key_missing", 400


class IdempotencyKeyInvalid(PilotAPIError):
    code, status = "idempotency_key_invalid", 400


class IdempotencyKeyMismatch(PilotAPIError):
    code, status = "idempotency_key_mismatch", 400


class UnknownWorkflow(PilotAPIError):
    code, status = "unknown_workflow", 400


class PayloadTooLarge(PilotAPIError):
    code, status = "payload_too_large", 413


class TaskCancelled(PilotAPIError):
    """409: this key's task was cancelled; a new run needs a new key."""
    code, status = "task_cancelled", 409


class InvalidTransition(PilotAPIError):
    """409: e.g. cancelling a finished task, retrying a succeeded one."""
    code, status = "invalid_transition", 409


class TaskFinished(PilotAPIError):
    """409: a new signal for a task that has already ended."""
    code, status = "task_finished", 409


class Conflict(PilotAPIError):
    """409: the server lost a race too often; safe to send again with the same key
    (the client does so by itself)."""
    code, status = "conflict", 409


class IdempotencyKeyReused(PilotAPIError):
    """422: this key was already used for a different workflow or payload."""
    code, status = "idempotency_key_reused", 422


class Throttled(PilotAPIError):
    """429: over the trigger rate; `retry_after` seconds (the client waits and
    retries by itself until its retries run out)."""
    code, status = "throttled", 429

    @property
    def retry_after(self) -> float | None:
        from pilot_client.retry import parse_retry_after

        return parse_retry_after(self.headers.get("retry-after"))


class InternalError(PilotAPIError):
    code, status = "internal_error", 500


class Unavailable(PilotAPIError):
    """503: the database (or the service) is unavailable for a moment."""
    code, status = "unavailable", 503


ERRORS_BY_CODE: dict[str, type[PilotAPIError]] = {
    cls.code: cls for cls in (
        NotAuthenticated, PermissionDenied, NotFound, MethodNotAllowed, NotAcceptable,
        UnsupportedMediaType, ParseError, ValidationError, IdempotencyKeyMissing,
        IdempotencyKeyInvalid, IdempotencyKeyMismatch, UnknownWorkflow, PayloadTooLarge,
        TaskCancelled, InvalidTransition, TaskFinished, Conflict, IdempotencyKeyReused, Throttled,
        InternalError, Unavailable)
}


def error_from_problem(status: int, problem: Mapping[str, Any] | None,
                       headers: Mapping[str, str] | None = None) -> PilotAPIError:
    """The exception for one error response: the class of its `code`, or
    PilotAPIError carrying an unknown code (or `http_<status>` without a body)."""
    problem = dict(problem or {})
    code = problem.get("code")
    if not isinstance(code, str) or not code:
        code = f"http_{status}"
    cls = ERRORS_BY_CODE.get(code, PilotAPIError)
    detail = problem.get("detail")
    return cls(detail if isinstance(detail, str) else "", code=code, status=status,
               problem=problem, headers=headers)


# --- not from the API --------------------------------------------------------------------

class PilotConnectionError(PilotError):
    """No answer from the server after every retry (connection refused, reset,
    timed out). For a trigger the outcome is unknown: call `trigger` again with
    the same key (`.key`) — it is safe, a second call replays."""

    def __init__(self, message: str, *, key: str | None = None, attempts: int = 0):
        self.key = key
        self.attempts = attempts
        super().__init__(message)


class WaitTimeout(PilotError):
    """`wait()` gave up; `.task` is the last state seen (the task goes on)."""

    def __init__(self, message: str, *, task=None):
        self.task = task
        super().__init__(message)


class WebhookVerificationError(PilotError):
    """A webhook's signature, timestamp or headers did not verify: reject it."""
