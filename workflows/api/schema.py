"""OpenAPI documentation pieces, kept out of the views so they stay thin.

The schema must tell the truth: every documented status comes with the
problem body it returns, and the Idempotency-Key header with its limits.
"""

from __future__ import annotations

import re

from drf_spectacular.serializers import PolymorphicProxySerializerExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema_field,
)
from rest_framework import serializers

from workflows.api.serializers import (
    CALLBACK_URL_HELP,
    PRIORITY_HELP,
    RUN_AFTER_HELP,
    BatchResponseSerializer,
    KeyField,
    ProblemSerializer,
    TaskSerializer,
)
from workflows.engine import MAX_BATCH
from workflows.registry import STEP_NAME_RE
from workflows.rules.keys import KEY_SCHEMA, MAX_KEY_LENGTH
from workflows.rules.states import TaskState

# status -> the codes that status carries
CODES = {
    400: "idempotency_key_missing, idempotency_key_invalid, idempotency_key_mismatch, "
         "unknown_workflow, validation_error, parse_error",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "task_cancelled (trigger), invalid_transition (cancel/retry), task_finished (signal), "
         "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "idempotency_key_reused",
    429: "throttled (see Retry-After)",
    503: "unavailable",
}


# Every state the filter accepts (TaskState: compensating was missing here once).
_STATE = "(" + "|".join(TaskState.values) + ")"


def errors(*statuses: int) -> dict:
    """Documented error responses: `application/problem+json` bodies, with the
    codes each status carries."""
    return {(s, "application/problem+json"): OpenApiResponse(
        ProblemSerializer, description=f"Problem: {CODES[s]}") for s in statuses}


# No pattern: an invalid traceparent is ignored, as W3C Trace Context requires,
# never refused.
TRACEPARENT = OpenApiParameter(
    "traceparent", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    description="W3C trace context (`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`). "
                "A new task stores it: its worker's log lines carry its trace id, its spans "
                "continue it (when OpenTelemetry is configured) and its webhooks send it on. "
                "An invalid value is ignored (a new trace starts), never refused.")

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", KEY_SCHEMA, OpenApiParameter.HEADER, required=False,
    description=f"The request's idempotency key: 1-{MAX_KEY_LENGTH} visible ASCII characters "
                "(0x21-0x7E), bare (`abc-123`) or as an RFC 8941 string (`\"abc-123\"`); both "
                "are the same key. Scoped to the calling client. Required unless the body carries "
                "`task_id` or the workflow derives keys from its payload (`key_fields`). "
                "Remembered until the task finished and the workflow's idempotency TTL "
                "(default 24 h; as it was at the trigger) passed.")

TRIGGER_DESCRIPTION = (
    "Trigger a workflow. Idempotent per (client, key): 202 + Location for a new task; "
    "200 with `Idempotent-Replayed: true` for a replay of a pending, running, retrying or "
    "succeeded task (the same task, with its result when it has one); 202 when a failed task "
    "is restarted from its checkpoints; 409 `task_cancelled`; 422 `idempotency_key_reused` "
    "when the key was used for a different workflow or payload.\n\n"
    "**Completion webhooks.** With `callback_url` (or the client's default endpoint) PILOT "
    "POSTs the task representation (without `deliveries`) when the task ends — succeeded, "
    "failed or cancelled — signed the Standard Webhooks way: headers `webhook-id` "
    "(`<task id>:<state>:<n>`, n = the task's restarts; stable across retries: dedupe on it), "
    "`webhook-timestamp`, `webhook-signature` (`v1,<base64 HMAC-SHA256 of "
    "\"<id>.<timestamp>.<body>\">` keyed with the client's `whsec_` secret) and "
    "`traceparent`. A 2xx is delivered; anything else, or no answer within 10 s, is retried "
    "with exponential backoff and full jitter (first within 2 s, doubling, at most 1 h apart) "
    "for up to 24 h. Each delivery is listed in the task's `deliveries`.\n\n"
    "**Trace context.** A W3C `traceparent` header is stored with a new task and continued in "
    "its worker's logs, its spans (with OpenTelemetry) and its webhooks.")

TRIGGER_RESPONSE_HEADERS = [
    OpenApiParameter("Idempotent-Replayed", {"type": "string", "enum": ["true", "false"]},
                     OpenApiParameter.HEADER, response=[200, 202],
                     description="`true` when this response replays an earlier trigger."),
    OpenApiParameter("Location", OpenApiTypes.STR, OpenApiParameter.HEADER, response=[202],
                     description="The task's URL."),
]

TRIGGER_RESPONSES = {
    202: OpenApiResponse(TaskSerializer, description="Created (or a failed task restarted); "
                                                     "Location names the task."),
    200: OpenApiResponse(TaskSerializer, description="Replayed: `Idempotent-Replayed: true`."),
    **errors(400, 401, 403, 409, 413, 415, 422, 429, 503),
}

LIST_PARAMETERS = [
    OpenApiParameter("cursor", OpenApiTypes.STR,
                     description="Opaque position from a previous page's `next`/`previous`."),
    OpenApiParameter("page_size", {"type": "integer", "minimum": 1, "maximum": 200},
                     description="Tasks per page (default 50)."),
    OpenApiParameter("state", {"type": "string", "pattern": f"^{_STATE}(,{_STATE})*$"},
                     description="One or more states, comma-separated."),
    OpenApiParameter("workflow", OpenApiTypes.STR),
    OpenApiParameter("idempotency_key", KEY_SCHEMA,
                     description="Bare or RFC 8941 quoted, as in the header."),
    OpenApiParameter("created_after", OpenApiTypes.DATETIME),
    OpenApiParameter("created_before", OpenApiTypes.DATETIME),
    OpenApiParameter("parent", OpenApiTypes.UUID,
                     description="Only the children of this task (newest first, as every list)."),
]


class BatchItemDoc(serializers.Serializer):
    # Nothing is required at the batch level: each item is checked on its own
    # and a bad one gets its own 400 result while the others go through.
    idempotency_key = serializers.JSONField(required=False, help_text="A key, as in the header.")
    workflow = serializers.JSONField(required=False, help_text="A registered workflow name.")
    payload = serializers.JSONField(required=False, help_text="A JSON object.")
    callback_url = serializers.JSONField(required=False, help_text=CALLBACK_URL_HELP)


class BatchRequestDoc(serializers.Serializer):
    # Items are any JSON at the batch level: one that is not a valid trigger
    # object gets its own 400 result (see BatchItemDoc for the shape).
    tasks = serializers.ListField(
        child=serializers.JSONField(allow_null=True), min_length=1, max_length=MAX_BATCH,
        help_text=f"1 to {MAX_BATCH} triggers, each an object with idempotency_key, workflow "
                  "and payload, and optionally callback_url (BatchItemDoc).")


class TaskPageDoc(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = TaskSerializer(many=True)


@extend_schema_field({"type": "object", "additionalProperties": {}},
                     component_name="AnyPayload")
class AnyPayloadField(serializers.DictField):
    """The payload of a workflow without a payload serializer: any JSON object.
    A named component, not an object written inline in each trigger shape:
    openapi-python-client names an inline object after the shape that holds
    it, and with one workflow (a one-member oneOf) it builds that name twice,
    refuses the duplicate and drops `POST /tasks` from the client it
    generates (tests/api/test_schema.py)."""


_trigger_shapes: dict = {}


def trigger_shapes() -> dict:
    """One documented request shape per registered workflow, keyed by its name:
    `workflow` is that name and `payload` that workflow's payload serializer, so
    the schema says exactly what each workflow accepts."""
    from workflows.registry import registry

    names = tuple(registry.names())
    if names not in _trigger_shapes:
        shapes = {}
        for workflow in registry.all():
            if workflow.payload_serializer is not None:
                payload = workflow.payload_serializer(help_text=f"Input of {workflow.name}.")
            else:
                payload = AnyPayloadField(required=False, help_text="Any JSON object.")
            title = "".join(part.title() for part in re.split(r"[._]", workflow.name))
            shapes[workflow.name] = type(f"Trigger{title}", (serializers.Serializer,), {
                "workflow": serializers.ChoiceField(choices=[workflow.name]),
                "payload": payload,
                "task_id": KeyField(required=False, help_text=(
                    "The idempotency key, if not in the Idempotency-Key header.")),
                "callback_url": serializers.URLField(required=False, max_length=2000,
                                                     help_text=CALLBACK_URL_HELP),
                "run_after": serializers.DateTimeField(required=False,
                                                       help_text=RUN_AFTER_HELP),
                "priority": serializers.IntegerField(required=False, min_value=-100,
                                                     max_value=100, help_text=PRIORITY_HELP),
            })
        _trigger_shapes.clear()
        _trigger_shapes[names] = shapes
    return _trigger_shapes[names]


class _TriggerShapes(PolymorphicProxySerializer):
    """The trigger body: one shape per workflow registered *now*. drf-spectacular
    calls a `serializers` callable once and keeps its answer for the life of the
    process, so a workflow registered after the first schema was served (or
    one unregistered) would be described wrongly ever after."""

    @property
    def serializers(self):
        return trigger_shapes()

    @serializers.setter
    def serializers(self, value):
        self._serializers = value


class _TriggerShapesExtension(PolymorphicProxySerializerExtension):
    # drf-spectacular picks an extension by the exact class: the proxy's own,
    # for this subclass too.
    target_class = "workflows.api.schema._TriggerShapes"


TRIGGER_REQUEST = _TriggerShapes(component_name="Trigger", serializers=trigger_shapes,
                                 resource_type_field_name="workflow")


def strict_request_bodies(result, generator, request, public):
    """drf-spectacular postprocessing hook: trigger bodies are required, and
    request bodies that refuse unknown fields say so (`additionalProperties:
    false`)."""
    from workflows.api.docs_views import api_prefix

    prefix = "/" + api_prefix()
    for path in (f"{prefix}tasks", f"{prefix}tasks/batch"):
        body = result.get("paths", {}).get(path, {}).get("post", {}).get("requestBody")
        if body is not None:
            body["required"] = True
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if (name.startswith("Trigger") or name in (
                "CancelRequest", "RetryRequest", "SignalRequest", "BatchRequestDocRequest")) \
                and component.get("type") == "object":
            component["additionalProperties"] = False
    return result


BATCH_DESCRIPTION = (
    f"Up to {MAX_BATCH} triggers in one request and a handful of queries. The response lists "
    "one result per item, in input order: `status` is the HTTP status that item would get "
    "alone (202, 200, 400, 409, 413, 422), with `code` for errors. Items are decided as if "
    "sent one after another: a key repeated within the batch replays the first. A malformed "
    "batch (not an object, no `tasks`, more than 1000) is a 400 for the whole request.")

BATCH_RESPONSES = {200: BatchResponseSerializer, **errors(400, 401, 403, 413, 415, 429, 503)}

CANCEL_DESCRIPTION = (
    "Cancel a task. Pending and retrying tasks are cancelled at once (or go through "
    "`cancelling` when succeeded steps must be compensated); a running task becomes "
    "`cancelling` and its worker stops at the next step boundary or heartbeat, runs the "
    "compensations and ends it `cancelled`. 409 `invalid_transition` for a finished or "
    "already cancelling task. Cancel and retry share one per-client rate limit "
    "(PILOT_ACTION_RATE): 429 `throttled` with Retry-After beyond it.")

RETRY_DESCRIPTION = (
    "Retry a failed or cancelled task with a fresh budget of attempts. It resumes from its "
    "checkpoints, from the first step with `from_start: true`, or from a named step with "
    "`from_step` (that step and every later one run again; the earlier checkpoints are kept; "
    "400 `validation_error` for a step the workflow does not have or with `from_start`). "
    "409 `invalid_transition` "
    "for any other state. Cancel and retry share one per-client rate limit "
    "(PILOT_ACTION_RATE): 429 `throttled` with Retry-After beyond it.")


SIGNAL_DESCRIPTION = (
    "Send signal `name` to a task (docs/waiting.md). The signal is stored before the 202; one "
    "sent before the task waits for it is kept, and a wait step consumes the oldest unconsumed "
    "signal of its name exactly once (its payload is the step's output). `Idempotency-Key` is "
    "required and scoped to the task: the same key and payload answers 200 with "
    "`Idempotent-Replayed: true` (even once the task finished), the key with another payload "
    "422 `idempotency_key_reused`. 409 `task_finished` for a new signal to a finished task. "
    "Needs `workflows.signal_task` (a client: its own tasks).")

SIGNAL_NAME = OpenApiParameter(
    "name", {"type": "string", "pattern": STEP_NAME_RE.pattern}, OpenApiParameter.PATH,
    description="The signal's name: 1-100 letters, digits, '_' or '-', not starting with "
                "a digit or '-'.")

SIGNAL_KEY = OpenApiParameter(
    "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=True,
    description=f"The signal's key, scoped to the task: 1-{MAX_KEY_LENGTH} visible ASCII "
                "characters (bare or an RFC 8941 quoted string).")


def exclude_pilot_endpoints(endpoints, **kwargs):
    """drf-spectacular preprocessing hook for a host project's own schema: leave
    PILOT's endpoints out of it (docs/embedding.md, "Names"). Without it the
    host's schema lists PILOT's routes and components beside its own, and a
    host serializer named like one of PILOT's (`TaskSerializer`) collides with
    it. PILOT's API keeps its own schema at its own `schema` route.

        SPECTACULAR_SETTINGS = {"PREPROCESSING_HOOKS": [
            "workflows.api.schema.exclude_pilot_endpoints"]}"""
    from workflows.api.base import PilotAPIView

    return [(path, regex, method, callback) for path, regex, method, callback in endpoints
            if not issubclass(getattr(callback, "cls", object), PilotAPIView)]

