"""pilot-client: the Python client for PILOT's REST API.

    from pilot_client import PilotClient

    with PilotClient("https://pilot.example.com", token) as pilot:
        run = pilot.trigger("acme.sync", {"batch": "2024-06-01"}, key="sync-2024-06-01")
        task = pilot.wait(run.task_id, timeout=300)

See docs/client.md in the PILOT repository.
"""

from pilot_client.client import PilotClient, __version__, new_key
from pilot_client.errors import (
    ERRORS_BY_CODE,
    Conflict,
    IdempotencyKeyInvalid,
    IdempotencyKeyMismatch,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    InternalError,
    InvalidTransition,
    MethodNotAllowed,
    NotAcceptable,
    NotAuthenticated,
    NotFound,
    ParseError,
    PayloadTooLarge,
    PermissionDenied,
    PilotAPIError,
    PilotConnectionError,
    PilotError,
    TaskCancelled,
    TaskFinished,
    Throttled,
    Unavailable,
    UnknownWorkflow,
    UnsupportedMediaType,
    ValidationError,
    WaitTimeout,
    WebhookVerificationError,
    error_from_problem,
)
from pilot_client.models import BatchItemResult, Signal, SignalResult, Step, Task, TriggerResult
from pilot_client.retry import RetryPolicy, parse_retry_after
from pilot_client.webhooks import sign_webhook, verify_webhook

__all__ = [
    "ERRORS_BY_CODE", "BatchItemResult", "Conflict", "IdempotencyKeyInvalid",
    "IdempotencyKeyMismatch", "IdempotencyKeyMissing", "IdempotencyKeyReused", "InternalError",
    "InvalidTransition", "MethodNotAllowed", "NotAcceptable", "NotAuthenticated", "NotFound",
    "ParseError", "PayloadTooLarge", "PermissionDenied", "PilotAPIError", "PilotClient",
    "PilotConnectionError", "PilotError", "RetryPolicy", "Signal", "SignalResult", "Step",
    "Task", "TaskCancelled", "TaskFinished", "Throttled", "TriggerResult", "Unavailable",
    "UnknownWorkflow", "UnsupportedMediaType",
    "ValidationError", "WaitTimeout", "WebhookVerificationError", "__version__",
    "error_from_problem", "new_key", "parse_retry_after", "sign_webhook", "verify_webhook",
]
