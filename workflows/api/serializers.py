"""What goes over the wire: task representation (out), trigger requests (in).

Input serializers only validate shape; the engine validates meaning (key
syntax, workflow, payload schema) so every entry point refuses the same things
with the same codes. Unknown input fields are refused rather than ignored, so
a client can never believe it set `state` or `result`.
"""

from __future__ import annotations

import json

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from workflows.engine import MAX_BATCH
from workflows.models import DeliveryState, StepCheckpoint, Task
from workflows.representation import delivery_data, signal_data, task_data, task_deliveries
from workflows.rules.fields import JSONInteger
from workflows.rules.keys import KEY_SCHEMA
from workflows.rules.states import TaskState


def is_unicode(text: str) -> bool:
    """False if `text` holds a lone surrogate (a JSON `"\\ud800"` escape with no
    pair): no database, log or response can encode it as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable_name(name: str) -> str:
    """A field name as an error message may echo it (lone surrogates escaped)."""
    return name if is_unicode(name) else name.encode("utf-8", "backslashreplace").decode()


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not declare (no mass assignment of read-only data)."""

    def validate(self, attrs):
        unknown = set(getattr(self, "initial_data", {}) or {}) - set(self.fields)
        if unknown:
            raise serializers.ValidationError(
                {printable_name(str(name)): ["Unknown field; it cannot be set."]
                 for name in sorted(unknown, key=str)})
        return attrs


class StringField(serializers.CharField):
    """A CharField that refuses numbers and booleans instead of coercing them
    (`"task_id": 0` is a mistake, not the key "0"), NUL characters, which no
    database text column can hold, and lone surrogates, which no UTF-8 can."""

    def to_internal_value(self, data):
        if not isinstance(data, str) or "\x00" in data or not is_unicode(data):
            self.fail("invalid")
        return super().to_internal_value(data)


class PayloadField(serializers.DictField):
    """A JSON object whose every key and string is valid Unicode: a lone
    surrogate anywhere is a 400 here (for a batch: that item alone), not an
    encoding error deep in the engine."""

    default_error_messages = {
        "surrogate": "Strings and keys may not contain lone surrogates (\\ud800-\\udfff).",
    }

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            self.fail("surrogate")
        except (RecursionError, TypeError, ValueError):
            pass  # too deep or not plain JSON: the engine refuses it with its own message
        return value


@extend_schema_field(KEY_SCHEMA)
class KeyField(StringField):
    """An idempotency key as sent, unchanged (not stripped, "" passed on): its rule
    is applied by the engine (workflows.rules.keys), so a key is refused with the same
    code, `idempotency_key_invalid`, whichever door it came through. The schema
    states the rule (KEY_SCHEMA)."""

    def __init__(self, **kwargs):
        super().__init__(trim_whitespace=False, **kwargs)

    def run_validation(self, data=serializers.empty):
        if data == "":  # the engine's to refuse, not DRF's generic "blank"
            return data
        return super().run_validation(data)


# --- out --------------------------------------------------------------------------------

class StepFailureSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(
        help_text="The task's attempt that failed (1 for the first).")
    at = serializers.DateTimeField()
    type = serializers.CharField(help_text="The exception's class name.")
    message = serializers.CharField(allow_blank=True, help_text="The exception's message.")
    traceback = serializers.CharField(allow_blank=True, help_text=(
        "Its last 30 frames, at most 8 KB, with URL credentials masked."))


class StepSerializer(serializers.ModelSerializer):
    output = serializers.JSONField(allow_null=True)
    failures = StepFailureSerializer(many=True, help_text=(
        "The step's failed attempts, oldest first (the last 10)."))

    class Meta:
        model = StepCheckpoint
        fields = ["index", "name", "state", "attempts", "output", "error", "failures",
                  "started_at", "finished_at"]
        read_only_fields = fields

    def to_representation(self, instance):
        data = super().to_representation(instance)
        if data["failures"] is None:  # a row the raw upsert made before any failure
            data["failures"] = []
        return data


class AttemptSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(help_text="1 for the first POST of the delivery.")
    at = serializers.DateTimeField(allow_null=True)
    status = serializers.IntegerField(allow_null=True, help_text="null: no HTTP answer.")
    error = serializers.CharField(allow_blank=True, help_text="Empty after a 2xx.")
    duration_ms = serializers.FloatField(allow_null=True)


class DeliverySerializer(serializers.Serializer):
    """One completion webhook of the task (docs/webhooks.md)."""

    id = serializers.CharField(help_text="The webhook-id header: <task id>:<state>:<n>, where n "
                                         "counts the task's restarts. Dedupe on it.")
    state = serializers.ChoiceField(choices=DeliveryState.choices,
                                    help_text="pending (being sent or retried), delivered "
                                              "(a 2xx answer), failed (given up after 24 h).")
    attempts = serializers.IntegerField(help_text="POSTs attempted so far.")
    last_status = serializers.IntegerField(allow_null=True, help_text=(
        "The HTTP status of the last attempt; null when it got no answer."))
    last_error = serializers.CharField(allow_blank=True, help_text=(
        "Why the last attempt did not count as delivered; empty after a 2xx."))
    next_attempt_at = serializers.DateTimeField(allow_null=True, help_text=(
        "When a pending delivery is tried next."))
    delivered_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField(help_text="When the task reached the state.")
    attempt_log = AttemptSerializer(many=True, help_text=(
        "The last 20 attempts with a recorded outcome, oldest first. An attempt counted in "
        "`attempts` but missing here was lost with its worker (and retried)."))

    def to_representation(self, instance):
        return delivery_data(instance)


class SignalOutSerializer(serializers.Serializer):
    name = serializers.CharField()
    payload = serializers.JSONField()
    received_at = serializers.DateTimeField()
    consumed_at = serializers.DateTimeField(
        allow_null=True, help_text="When a wait step consumed it; null while it is kept.")


class WaitingForSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["timer", "signal", "children"])
    name = serializers.CharField(required=False, help_text="The awaited signal's name.")
    until = serializers.DateTimeField(
        required=False, help_text="When the wait ends by itself: a timer's end, a signal's "
                                  "timeout (absent: it waits until its signal comes).")


class SignalResponseSerializer(serializers.Serializer):
    signal = SignalOutSerializer()


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(serializers.JSONField):
    """A JSON object (null, lists and scalars are refused)."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError("Must be a JSON object.")
        return super().to_internal_value(data)


class SignalSerializer(StrictSerializer):
    payload = JSONObjectField(
        required=False, default=dict,
        help_text="A JSON object: the output of the wait step that consumes the signal.")


class TaskSerializer(serializers.ModelSerializer):
    payload = serializers.JSONField()
    result = serializers.JSONField(allow_null=True)
    steps = StepSerializer(many=True, read_only=True)
    state = serializers.ChoiceField(choices=TaskState.choices)
    callback_url = serializers.SerializerMethodField(help_text=(
        "Where the task's completion webhooks go: the trigger's callback_url, else the "
        "client's default endpoint when the task was triggered; null for none."))
    deliveries = serializers.SerializerMethodField(help_text=(
        "Its completion webhooks, one per terminal state it reached, oldest first."))
    waiting_for = serializers.SerializerMethodField(help_text=(
        "What a `waiting` task waits for; null in every other state."))
    signals = serializers.SerializerMethodField(help_text=(
        "The signals sent to it, oldest first (docs/waiting.md)."))
    version = serializers.IntegerField(help_text=(
        "The version of its workflow it was triggered on; every attempt runs that version."))
    parent = serializers.UUIDField(allow_null=True, source="parent_id", help_text=(
        "The task whose step started it (a child task), else null."))
    children_count = serializers.IntegerField(help_text=(
        "Child tasks its steps started (GET /tasks?parent=<id> lists them)."))

    class Meta:
        model = Task
        fields = ["id", "idempotency_key", "workflow", "state", "payload", "result", "error",
                  "error_type", "attempts", "max_attempts", "replays", "next_attempt_at",
                  "waiting_for", "run_after", "priority", "source", "version", "parent",
                  "children_count", "trace_id", "created_at", "started_at",
                  "finished_at", "expires_at", "steps", "callback_url", "deliveries",
                  "signals"]
        read_only_fields = fields

    @extend_schema_field(serializers.URLField(allow_null=True))
    def get_callback_url(self, task):
        return task.callback_url or None

    @extend_schema_field(DeliverySerializer(many=True))
    def get_deliveries(self, task):
        return [delivery_data(d) for d in task_deliveries(task)]

    @extend_schema_field(WaitingForSerializer(allow_null=True))
    def get_waiting_for(self, task):
        return task_data(task, [], [], [])["waiting_for"]

    @extend_schema_field(SignalOutSerializer(many=True))
    def get_signals(self, task):
        return [signal_data(s) for s in task.signals.order_by("id")]


class BatchResultSerializer(serializers.Serializer):
    status = serializers.IntegerField(help_text="The HTTP status this item would get alone.")
    code = serializers.CharField(required=False, help_text="The error code, for errors.")
    detail = serializers.CharField(required=False)
    errors = serializers.DictField(required=False)
    replayed = serializers.BooleanField(required=False)
    task = TaskSerializer(required=False)


class BatchResponseSerializer(serializers.Serializer):
    results = BatchResultSerializer(many=True)


class ProblemSerializer(serializers.Serializer):
    type = serializers.CharField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    code = serializers.CharField(help_text="Stable machine-readable error code.")
    errors = serializers.DictField(required=False, help_text="Per-field errors (400).")


class WorkflowSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.IntegerField(help_text="The newest registered version (what a "
                                       "trigger runs).")
    versions = serializers.ListField(child=serializers.IntegerField(), help_text=(
        "Every registered version, oldest first: tasks keep the one they were triggered on."))
    description = serializers.CharField()
    steps = serializers.ListField(child=serializers.DictField())
    max_attempts = serializers.IntegerField()
    backoff = serializers.DictField()
    idempotency_ttl_seconds = serializers.FloatField()
    key_fields = serializers.ListField(child=serializers.CharField())
    max_running = serializers.IntegerField(
        allow_null=True, help_text="At most this many of one client's tasks of this workflow "
        "run at once (null: the client-wide PILOT_MAX_RUNNING_PER_CLIENT).")
    concurrency = serializers.IntegerField(
        allow_null=True, help_text="At most this many of its tasks run at once over all "
        "clients (null: no limit).")


# --- in ---------------------------------------------------------------------------------

CALLBACK_URL_HELP = (
    "Where to POST the task's completion webhook (http or https; private, loopback and "
    "link-local hosts are refused). Without it, the client's default endpoint, if it has one. "
    "See docs/webhooks.md.")


RUN_AFTER_HELP = ("Not before this time: an ISO 8601 date-time with an offset, at most "
                  "PILOT_MAX_RUN_AFTER_DAYS (365) days ahead; in the past means now. The "
                  "task is pending and claimed no earlier (the database's clock).")
PRIORITY_HELP = ("-100 to 100 (default 0): among due tasks a worker claims the highest "
                 "priority first, then the oldest due. Caps still apply.")


class TriggerSerializer(StrictSerializer):
    workflow = StringField(max_length=200, help_text="A registered workflow name.")
    payload = PayloadField(required=False, default=dict,
                           help_text="The workflow's input (a JSON object).")
    callback_url = StringField(required=False, max_length=2000, help_text=CALLBACK_URL_HELP)
    task_id = KeyField(required=False, help_text=(
        "The idempotency key, if not sent in the Idempotency-Key header."))
    run_after = StringField(required=False, max_length=64, help_text=RUN_AFTER_HELP)
    priority = JSONInteger(required=False, min_value=-100, max_value=100,
                           help_text=PRIORITY_HELP)


class BatchItemSerializer(StrictSerializer):
    idempotency_key = KeyField(required=False)
    workflow = StringField(max_length=200)
    payload = PayloadField(required=False, default=dict)
    callback_url = StringField(required=False, max_length=2000)
    run_after = StringField(required=False, max_length=64, help_text=RUN_AFTER_HELP)
    priority = JSONInteger(required=False, min_value=-100, max_value=100,
                           help_text=PRIORITY_HELP)


class BatchSerializer(StrictSerializer):
    # Items are checked one by one in the view, so one bad item fails alone.
    tasks = serializers.ListField(child=serializers.JSONField(allow_null=True), min_length=1,
                                  max_length=MAX_BATCH)


class RetrySerializer(StrictSerializer):
    from_start = serializers.BooleanField(
        required=False, default=False,
        help_text="Run every step again instead of resuming from the checkpoints.")
    from_step = StringField(
        required=False, max_length=100,
        help_text="Run this step (by name) and every later one again; the earlier "
                  "checkpoints are kept. Not with from_start.")

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if attrs.get("from_step") is not None and attrs.get("from_start"):
            raise serializers.ValidationError(
                {"from_step": ["Not with from_start: from_start runs every step again."]})
        return attrs


class CancelSerializer(StrictSerializer):
    reason = StringField(required=False, allow_blank=True, max_length=500, default="")
