"""Everything a workflow author imports, from one module (docs/writing-workflows.md).

    from rest_framework import serializers

    from workflows.sdk import JSONInteger, RetryableError, StepContext, define_workflow

    class SyncPayload(serializers.Serializer):
        batch = JSONInteger(min_value=1)

    sync = define_workflow("acme.sync", key_fields=("batch",),
                           payload_serializer=SyncPayload)

    @sync.step
    def fetch(ctx: StepContext) -> dict:
        ...

A host project's own code starts a run in-process with `task_trigger` (the
engine's, as the API calls it; docs/embedding.md, "Triggering from your code").

The names are the objects of the modules that define them, re-exported
unchanged (`workflows.sdk.define_workflow is workflows.registry.define_workflow`),
so code that imports them from there keeps working. Testing a workflow is
`workflows.testing.run_workflow`, kept apart: it is for test code only.
"""

from workflows.engine import StepContext, TriggerOutcome, task_trigger
from workflows.registry import (
    DEFAULT_IDEMPOTENCY_TTL,
    RetryPolicy,
    Schedule,
    Step,
    Workflow,
    define_workflow,
)
from workflows.rules.errors import (
    CancelRequested,
    LeaseLost,
    NonRetryableError,
    RetryableError,
    StepError,
    ValidationFailed,
    WorkerSignal,
)
from workflows.rules.fields import JSONBoolean, JSONInteger, JSONNumber, JSONString

__all__ = [  # noqa: RUF022 - grouped by what an author does with them
    # defining a workflow
    "define_workflow", "Workflow", "Step", "Schedule", "RetryPolicy", "DEFAULT_IDEMPOTENCY_TTL",
    # what a step receives
    "StepContext",
    # what a step raises: RetryableError (tried again while attempts remain),
    # NonRetryableError (fails the task now); StepError is their base
    "StepError", "RetryableError", "NonRetryableError",
    # what ctx.heartbeat() / ctx.sleep() raise to stop a step: let them propagate
    "WorkerSignal", "LeaseLost", "CancelRequested",
    # what a trigger (or `workflows.testing.run_workflow`) raises for a payload
    # its workflow's serializer refuses
    "ValidationFailed",
    # payload serializer fields that accept JSON's types only (no "1" for 1)
    "JSONInteger", "JSONNumber", "JSONBoolean", "JSONString",
    # starting a run from a host's own code: what the API's POST /tasks calls
    "task_trigger", "TriggerOutcome",
]
