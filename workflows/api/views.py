"""The REST API (docs: GET …/docs). Thin views: validate, call one engine or selector
function, serialize. Errors are raised and rendered by api.problems."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, prefetch_related_objects
from django.urls import reverse
from rest_framework import status
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from workflows.api import schema as docs
from workflows.api.base import PilotAPIView, documented
from workflows.api.pagination import TaskCursorPagination
from workflows.api.permissions import CanTrigger
from workflows.api.problems import pilot_error_dict
from workflows.api.serializers import (
    BatchItemSerializer,
    BatchSerializer,
    CancelSerializer,
    RetrySerializer,
    SignalResponseSerializer,
    SignalSerializer,
    TaskSerializer,
    TriggerSerializer,
    WorkflowSerializer,
)
from workflows.api.throttling import (
    ActionRateThrottle,
    TriggerRateThrottle,
    trigger_throttle_consume,
)
from workflows.engine import (
    TriggerRequest,
    task_cancel,
    task_retry,
    task_signal,
    task_trigger,
    task_trigger_many,
)
from workflows.models import StepCheckpoint
from workflows.observability.middleware import request_trace_context
from workflows.registry import registry
from workflows.representation import signal_data, task_data
from workflows.rules.errors import (
    IdempotencyKeyMismatch,
    PilotError,
    ValidationFailed,
    plain_errors,
)
from workflows.rules.keys import normalize_key
from workflows.rules.states import Source
from workflows.selectors import task_get_for, tasks_filtered_for

MAX_BATCH_BODY_BYTES = 16 * 1024 * 1024


def _with_steps(queryset):
    """With its steps and its signals (two queries for a page)."""
    return queryset.prefetch_related(
        Prefetch("steps", queryset=StepCheckpoint.objects.order_by("index")), "signals")


def _trace(request) -> dict:
    """The trace context a trigger stores on its tasks (docs/tracing.md)."""
    trace_id, traceparent = request_trace_context(request)
    return {"trace_id": trace_id, "traceparent": traceparent}


def _key_from(request, body_key):
    """The idempotency key as sent: the Idempotency-Key header (bare or RFC 8941
    quoted) or the body's task_id; the engine normalizes it (once — a key that
    is itself a quote character must not be unquoted twice). Both present and
    naming different keys is a 400."""
    header = request.headers.get("Idempotency-Key")
    if header is not None and body_key is not None \
            and normalize_key(header) != normalize_key(body_key):
        raise IdempotencyKeyMismatch(
            "The Idempotency-Key header and the body's task_id name different keys")
    return header if header is not None else body_key


def _with_deliveries(tasks) -> list:
    """`tasks` with their deliveries prefetched: one query, only when one of
    them has an endpoint (a task without one has none)."""
    tasks = list(tasks)
    prefetch_related_objects([t for t in tasks if t.callback_url], "deliveries")
    return tasks


def _trigger_response(outcome) -> Response:
    task = outcome.task
    created = outcome.outcome == "created"
    steps: list[Any] | None = [] if created else None  # a new task has no steps yet
    deliveries: list[Any] | None = [] if created else None  # nor deliveries
    signals: list[Any] | None = [] if created else None  # nor signals
    headers = {"Idempotent-Replayed": "true" if outcome.replayed else "false"}
    if outcome.http_status == status.HTTP_202_ACCEPTED:
        headers["Location"] = reverse("pilot_api:task-detail", kwargs={"task_id": task.pk})
    return Response(task_data(task, steps, deliveries, signals), status=outcome.http_status,
                    headers=headers)


def _validated(serializer_class, data, what: str = "The request body"):
    """Shape-check `data` with `serializer_class`; ValidationFailed (400) if wrong."""
    if not isinstance(data, dict):
        raise ValidationFailed(f"{what} must be a JSON object",
                               errors={"non_field_errors": ["Expected a JSON object."]})
    serializer = serializer_class(data=data)
    if not serializer.is_valid():
        raise ValidationFailed(f"{what} is not valid; see errors",
                               errors=plain_errors(serializer.errors))
    return serializer.validated_data


class TaskCollectionView(PilotAPIView):
    """GET: list the caller's tasks. POST: trigger a workflow idempotently."""

    def get_permissions(self):
        if self.request.method == "POST":
            return [IsAuthenticated(), CanTrigger()]
        return [IsAuthenticated()]

    def get_throttles(self):
        return [TriggerRateThrottle()] if self.request.method == "POST" else []

    @documented(operation_id="tasks_list", parameters=docs.LIST_PARAMETERS,
                   responses={200: docs.TaskPageDoc, **docs.errors(400, 401)},
                   description="The caller's tasks, newest first (all tasks with the "
                               "workflows.view_all_tasks permission). Cursor pagination.")
    def get(self, request):
        tasks = tasks_filtered_for(request.user, request.query_params)
        paginator = TaskCursorPagination()
        page = paginator.paginate_queryset(_with_steps(tasks), request, view=self)
        return paginator.get_paginated_response([task_data(task)
                                                 for task in _with_deliveries(page)])

    @documented(operation_id="tasks_trigger", request=docs.TRIGGER_REQUEST,
                parameters=[docs.IDEMPOTENCY_KEY, docs.TRACEPARENT,
                            *docs.TRIGGER_RESPONSE_HEADERS],
                   responses=docs.TRIGGER_RESPONSES,
                   description=docs.TRIGGER_DESCRIPTION)
    def post(self, request):
        data = _validated(TriggerSerializer, request.data)
        outcome = task_trigger(owner=request.user, key=_key_from(request, data.get("task_id")),
                               workflow=data["workflow"], payload=data["payload"],
                               callback_url=data.get("callback_url"), source=Source.API,
                               run_after=data.get("run_after"), priority=data.get("priority"),
                               **_trace(request))
        return _trigger_response(outcome)


class TaskBatchView(PilotAPIView):
    """POST: up to 1000 triggers in one request, one result per item, in order."""

    permission_classes = [IsAuthenticated, CanTrigger]
    max_body_bytes = MAX_BATCH_BODY_BYTES

    @documented(operation_id="tasks_trigger_batch", request=docs.BatchRequestDoc,
                parameters=[docs.TRACEPARENT],
                   responses=docs.BATCH_RESPONSES, description=docs.BATCH_DESCRIPTION)
    def post(self, request):
        items = _validated(BatchSerializer, request.data)["tasks"]
        trigger_throttle_consume(request.user, len(items))
        requests, results = [], [None] * len(items)
        for index, item in enumerate(items):
            try:
                data = _validated(BatchItemSerializer, item, what="This item")
            except ValidationFailed as exc:
                results[index] = pilot_error_dict(exc)
                continue
            requests.append((index, TriggerRequest(data["workflow"], data["payload"],
                                                   data.get("idempotency_key"),
                                                   data.get("callback_url"),
                                                   data.get("run_after"),
                                                   data.get("priority"))))
        if requests:
            outcomes = task_trigger_many(owner=request.user, requests=[r for _, r in requests],
                                         source=Source.BATCH, **_trace(request))
            tasks = [o.task for o in outcomes if not isinstance(o, PilotError)]
            steps = _steps_by_task(tasks)
            replayed = [o.task for o in outcomes
                        if not isinstance(o, PilotError) and o.outcome != "created"]
            _with_deliveries(replayed)
            prefetch_related_objects(replayed, "signals")  # one query, for the replays
            for (index, _), outcome in zip(requests, outcomes, strict=True):
                if isinstance(outcome, PilotError):
                    results[index] = pilot_error_dict(outcome)
                    continue
                task = outcome.task
                results[index] = {"status": outcome.http_status, "replayed": outcome.replayed,
                                  "task": task_data(task, steps.get(task.pk, []),
                                                    *([[], []] if outcome.outcome == "created"
                                                      else [None, None]))}
        return Response({"results": [_batch_item(r) for r in results]})


def _batch_item(result: dict) -> dict:
    if "task" in result:
        return result
    item = {"status": result["status"], "code": result["code"], "detail": result["detail"]}
    if result.get("errors") is not None:
        item["errors"] = result["errors"]
    return item


def _steps_by_task(tasks) -> dict:
    by_task: dict = {}
    ids = [t.pk for t in tasks]
    if ids:
        for step in StepCheckpoint.objects.filter(task_id__in=ids).order_by("index"):
            by_task.setdefault(step.task_id, []).append(step)
    return by_task


class TaskDetailView(PilotAPIView):
    @documented(operation_id="tasks_read", responses={200: TaskSerializer,
                                                         **docs.errors(401, 404)})
    def get(self, request, task_id):
        task = task_get_for(request.user, task_id)
        return Response(task_data(task))  # its deliveries: one query, only with an endpoint


class TaskCancelView(PilotAPIView):
    throttle_classes = [ActionRateThrottle]

    @documented(operation_id="tasks_cancel", request=CancelSerializer,
                   responses={200: TaskSerializer,
                              **docs.errors(400, 401, 403, 404, 409, 429, 503)},
                   description=docs.CANCEL_DESCRIPTION)
    def post(self, request, task_id):
        data = _validated(CancelSerializer, request.data or {})
        task = task_cancel(task_id=task_get_for(request.user, task_id).pk, user=request.user,
                           reason=data["reason"] or "cancelled through the API")
        return Response(task_data(task))


class TaskRetryView(PilotAPIView):
    throttle_classes = [ActionRateThrottle]

    @documented(operation_id="tasks_retry", request=RetrySerializer,
                   responses={202: TaskSerializer,
                              **docs.errors(400, 401, 403, 404, 409, 429, 503)},
                   description=docs.RETRY_DESCRIPTION)
    def post(self, request, task_id):
        data = _validated(RetrySerializer, request.data or {})
        task = task_retry(task_id=task_get_for(request.user, task_id).pk, user=request.user,
                          from_start=data["from_start"], from_step=data.get("from_step"))
        return Response(task_data(task), status=status.HTTP_202_ACCEPTED)


class TaskSignalView(PilotAPIView):
    """POST: send a signal to a task (docs/waiting.md)."""

    throttle_classes = [ActionRateThrottle]

    @documented(operation_id="tasks_signal", request=SignalSerializer,
                parameters=[docs.SIGNAL_NAME, docs.SIGNAL_KEY],
                responses={202: SignalResponseSerializer, 200: SignalResponseSerializer,
                           **docs.errors(400, 401, 403, 404, 409, 413, 422, 429, 503)},
                description=docs.SIGNAL_DESCRIPTION)
    def post(self, request, task_id, name):
        data = _validated(SignalSerializer, request.data or {})
        task = task_get_for(request.user, task_id)
        outcome = task_signal(task_id=task.pk, name=name, payload=data["payload"],
                              key=request.headers.get("Idempotency-Key"), user=request.user)
        return Response({"signal": signal_data(outcome.signal)}, status=outcome.http_status,
                        headers={"Idempotent-Replayed": "true" if outcome.replayed
                                 else "false"})


class WorkflowListView(PilotAPIView):
    @documented(operation_id="workflows_list",
                   responses={200: WorkflowSerializer(many=True), **docs.errors(401)})
    def get(self, request):
        return Response([{**w.describe(),
                          "versions": [v.version for v in registry.versions(w.name)]}
                         for w in registry.all()])

