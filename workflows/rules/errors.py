"""Domain errors. Pure: no database.

Every error PILOT reports carries a stable snake_case `code`, an HTTP status
and a title. The API maps them to problem+json in one place, the admin to
messages, commands to `CommandError`; nobody matches on message text.

Two more families live here:
- what a step raises to steer the runner (`RetryableError`, `NonRetryableError`);
- what the worker's fenced writes raise when it no longer owns the task
  (`LeaseLost`, `CancelRequested`).
"""

from __future__ import annotations

from typing import Any


def plain_errors(detail: Any) -> Any:
    """Per-field errors as plain JSON (a `ValidationFailed`'s `errors`): DRF's
    ErrorDetail strings and lazy messages become str, keys become str, tuples
    lists."""
    if isinstance(detail, dict):
        return {str(k): plain_errors(v) for k, v in detail.items()}
    if isinstance(detail, (list, tuple)):
        return [plain_errors(v) for v in detail]
    return str(detail)


class PilotError(Exception):
    code = "error"
    http_status = 400
    title = "Request failed"

    def __init__(self, detail: str | None = None, *, errors: dict | None = None):
        self.detail = detail or self.title
        self.errors = errors
        super().__init__(self.detail)


# --- trigger (docs/design.md, "Idempotent trigger") --------------------------------------

class IdempotencyKeyMissing(PilotError):
    code = "idempotency_key_missing"
    title = "Idempotency key missing"


class IdempotencyKeyInvalid(PilotError):
    code = "idempotency_key_invalid"
    title = "Idempotency key invalid"


class IdempotencyKeyMismatch(PilotError):
    """The `Idempotency-Key` header and the body's `task_id` disagree."""

    code = "idempotency_key_mismatch"
    title = "Idempotency key mismatch"


class UnknownWorkflow(PilotError):
    code = "unknown_workflow"
    title = "Unknown workflow"


class ValidationFailed(PilotError):
    code = "validation_error"
    title = "Invalid request"


class PayloadTooLarge(PilotError):
    code = "payload_too_large"
    http_status = 413
    title = "Payload too large"


class TaskCancelled(PilotError):
    code = "task_cancelled"
    http_status = 409
    title = "Task was cancelled"


class IdempotencyKeyReused(PilotError):
    code = "idempotency_key_reused"
    http_status = 422
    title = "Idempotency key reused with a different request"


# --- operator actions ---------------------------------------------------------------

class TaskNotFound(PilotError):
    code = "not_found"
    http_status = 404
    title = "Not found"


class InvalidTransition(PilotError):
    code = "invalid_transition"
    http_status = 409
    title = "Transition not allowed"


class PermissionDenied(PilotError):
    code = "permission_denied"
    http_status = 403
    title = "Permission denied"


class Unavailable(PilotError):
    """A 503: the database is unreachable (the API's error handler, /readyz) or
    the shared cache misconfigured (CacheMisconfigured)."""

    code = "unavailable"
    http_status = 503
    title = "Service unavailable"


class TaskFinished(PilotError):
    """A signal for a task that has already ended (409): nothing will wait for it."""

    code = "task_finished"
    http_status = 409
    title = "Task finished"


class Conflict(PilotError):
    """Lost a race too many times in a row; safe to retry with the same key."""

    code = "conflict"
    http_status = 409
    title = "Concurrent update, retry the request"


# --- the worker's view ----------------------------------------------------------------
# BaseException, like asyncio.CancelledError: a step's `except Exception` must not
# swallow the signal that it no longer owns the task.

class WorkerSignal(BaseException):
    code = "worker_signal"

    def __init__(self, detail: str = ""):
        self.detail = detail or self.code
        super().__init__(self.detail)


class LeaseLost(WorkerSignal):
    """A fenced write found the task no longer ours: another worker took it over
    after our lease expired, or it ended. The worker must stop touching it."""

    code = "lease_lost"


class CancelRequested(WorkerSignal):
    """A fenced write found the task `cancelling` under our own lease: start no
    further step, compensate, finish the cancel."""

    code = "cancel_requested"


# --- what steps raise -------------------------------------------------------------------

class StepError(Exception):
    """Base for errors a step raises on purpose."""

    retryable = True


class RetryableError(StepError):
    """Transient: the attempt is retried with backoff while attempts remain."""

    retryable = True


class NonRetryableError(StepError):
    """Permanent: the task fails now (after compensations), no retry."""

    retryable = False


class WorkflowChanged(NonRetryableError):
    """A stored checkpoint names a different step than the workflow now has at
    that index: resuming would skip the wrong step, so the run stops."""


class WorkflowVersionMissing(NonRetryableError):
    """The version of its workflow a task was triggered on is no longer
    registered: no step of another version may run for it, so it fails."""


class ChildFailed(StepError):
    """A children wait found a child failed or cancelled (and the step does not
    collect failures). Not retried unless the workflow's `retry_on` names it:
    the children stay as they ended; compensations run as for any failure."""

    retryable = None  # type: ignore[assignment]  # the workflow's retry_on decides


class SignalTimeout(StepError):
    """A signal wait's timeout passed before its signal came. Not retried unless
    the workflow's `retry_on` names it; compensations run as for any failure."""

    retryable = None  # type: ignore[assignment]  # the workflow's retry_on decides
