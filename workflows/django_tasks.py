"""PILOT as a backend for Django's task framework (docs/django-tasks.md).

    TASKS = {"default": {"BACKEND": "workflows.django_tasks.PilotTaskBackend"}}

    from workflows.django_tasks import task   # Django's @task, which takes PILOT's options

    @task(key_fields=("order_id",))
    def charge(order_id, amount):
        ...

    result = charge.enqueue(7, amount=5)   # a PILOT task: result.id is its id

A `@task` function enqueued here becomes a PILOT task of a one-step workflow
named by the function's module path (`shop.tasks.charge`), registered when
the task is defined — and, in a process that never imported its module, when
the name is first asked for (`registry.find` → `_load`), so a worker finds it.
Its attempts, leases, retries, caps, console and API are PILOT's.

- `enqueue()` is PILOT's idempotent trigger (`task_trigger`, source `tasks`):
  the arguments are bound to the function's signature and stored by name
  (`{"args": [...], "kwargs": {...}}`, JSON only), so `charge.enqueue(7, 5)` and
  `charge.enqueue(order_id=7, amount=5)` are the same request. The key is
  derived from the arguments the task's `key_fields` name, else fresh: the same
  key with the same arguments returns the same TaskResult id (a failed one runs
  again), other arguments raise PILOT's IdempotencyKeyReused. `priority` and
  `run_after` are the trigger's (docs/waiting.md).
- The tasks belong to the `tasks` user (created on first use, no password, no
  token), or to the existing user OPTIONS["OWNER"] names.
- `get_result(id)` reads the task; its status is READY (pending, retrying,
  waiting), RUNNING (running, or undoing: compensating, cancelling),
  SUCCESSFUL or FAILED (failed, cancelled).
- `task_enqueued`, `task_started` and `task_finished` are sent from PILOT's
  events (`_on_event`), in the process that made the change, after it
  committed: a trigger that created the task or a `retry`; a claim; an ending.

Imports Django's `django.tasks` when it has one (6.0+), else the `django_tasks`
backport (`pip install "pilot-workflows[tasks]"`).
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import inspect
import threading
import uuid
from typing import TYPE_CHECKING, Any

import django
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

if TYPE_CHECKING or django.VERSION >= (6, 0):  # django.tasks; the stubs describe it
    from django.tasks import TaskContext, TaskResult, TaskResultStatus
    from django.tasks import task as framework_task
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:  # Django 5.2: the backport, the same API under other names
    from django_tasks import TaskContext, TaskResult, TaskResultStatus
    from django_tasks import task as framework_task
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

from workflows.accounts import tasks_owner_get
from workflows.apps import pilot_task_backend_alias
from workflows.engine import StepContext, task_trigger
from workflows.observability.events import Event, add_listener
from workflows.registry import NAME_RE, Workflow, registry
from workflows.rules.fingerprint import derive_key
from workflows.rules.states import Source, TaskState
from workflows.selectors import task_with_attempts

STATUS = {
    TaskState.PENDING: TaskResultStatus.READY,
    TaskState.RETRYING: TaskResultStatus.READY,
    TaskState.WAITING: TaskResultStatus.READY,
    TaskState.RUNNING: TaskResultStatus.RUNNING,
    TaskState.COMPENSATING: TaskResultStatus.RUNNING,
    TaskState.CANCELLING: TaskResultStatus.RUNNING,
    TaskState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    TaskState.FAILED: TaskResultStatus.FAILED,
    TaskState.CANCELLED: TaskResultStatus.FAILED,
}
OPTIONS = ("OWNER",)
# The step context of the Django task this thread runs (for `heartbeat`).
_running: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar(
    "pilot_django_task", default=None)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PilotTask(Task):
    """A Django Task with PILOT's options, made by `@task(...)` on a
    PilotTaskBackend (its `task_class`): `key_fields`, the arguments (by name)
    its idempotency key is derived from (none: a fresh key per enqueue), and
    `max_attempts` (PILOT's retries: a step error PILOT counts as transient —
    RetryableError, ConnectionError, TimeoutError, OperationalError — is tried
    again while attempts remain; any other fails the task)."""

    key_fields: tuple[str, ...] = ()
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.key_fields, list):
            object.__setattr__(self, "key_fields", tuple(self.key_fields))
        Task.__post_init__(self)  # validate_task; zero-argument super() fails in slots


class TaskArguments(serializers.Serializer):
    """A Django task's payload, as enqueue() writes it: a trigger from the API
    or the console must send the same shape."""

    args = serializers.ListField(required=False)
    kwargs = serializers.DictField(required=False)


class TaskWorkflow(Workflow):
    """The one-step workflow a Django task runs as; `task` is the Task object
    its module defines."""

    def __init__(self, task: Task) -> None:
        super().__init__(task.module_path, max_attempts=getattr(task, "max_attempts", 3),
                         payload_serializer=TaskArguments,
                         description=f"Django task {task.module_path} "
                                     "(enqueued through django.tasks).")
        self.task = task
        self.add_step(task.name, _run_step)


def task(function: Any = None, **options: Any) -> Any:
    """Django's `@task` (django.tasks.task, or the backport's), for code that
    passes PILOT's own options — `key_fields`, `max_attempts` (PilotTask) —
    which the framework hands to the backend's task class but django-stubs'
    signature does not list."""
    if function is None:
        return framework_task(**options)
    return framework_task(function, **options)


def _run_step(ctx: StepContext) -> Any:
    """The step: call the task function with its stored arguments (and, if it
    takes one, a TaskContext); its return value, as JSON, is the task's result."""
    task = _task_of(ctx.workflow)
    args, kwargs = ctx.payload.get("args", []), ctx.payload.get("kwargs", {})
    token = _running.set(ctx)
    try:
        if task.takes_context:
            context = TaskContext(task_result=task.get_backend().get_result(ctx.task_id))
            value = task.call(context, *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
    finally:
        _running.reset(token)
    return normalize_json(value)


def _task_of(name: str) -> Task:
    workflow = registry.find(name)
    if not isinstance(workflow, TaskWorkflow):
        raise LookupError(f"{name} is not a Django task")
    return workflow.task


def heartbeat() -> None:
    """Renew the lease of the PILOT task this task function runs as: a task
    that runs longer than PILOT_LEASE_SECONDS calls it now and then, or PILOT
    takes it for dead and runs it again. Raises PILOT's worker signal (let it
    propagate) when the task was cancelled or its lease lost."""
    ctx = _running.get()
    if ctx is None:
        raise RuntimeError("heartbeat() renews the lease of a task PILOT runs; "
                           "this code is not running as one")
    ctx.heartbeat()


_registering = threading.Lock()


def workflow_for(task: Task) -> TaskWorkflow:
    """The workflow `task` runs as, registered now if it is not yet (under a
    lock: two threads of a web process may load one name at once). A task of
    the same path defined again (its module reloaded) replaces the old one."""
    with _registering:
        found = registry.registered(task.module_path)
        if isinstance(found, TaskWorkflow) and found.task.func is task.func:
            return found
        if found is not None and not isinstance(found, TaskWorkflow):
            raise InvalidTask(f"{task.module_path} is already the name of a PILOT workflow")
        registry.unregister(task.module_path)
        return registry.register(TaskWorkflow(task))  # type: ignore[return-value]  # as given


def _load(name: str) -> Workflow | None:
    """A registry loader: the Django task `name` names, on a PilotTaskBackend,
    registered now (importing its module registers it, through `validate_task`).
    Only modules of installed apps are imported: a name sent to the API never
    imports anything else."""
    module_name, _, attribute = name.rpartition(".")
    if not module_name or apps.get_containing_app_config(module_name) is None:
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    found = getattr(module, attribute, None)
    if not isinstance(found, PilotTask) or found.module_path != name \
            or not isinstance(found.get_backend(), PilotTaskBackend):
        return None
    return workflow_for(found)


class PilotTaskBackend(BaseTaskBackend):
    """Django's task framework on PILOT (module docstring). OPTIONS: `OWNER`, the
    username the tasks belong to (default `tasks`). QUEUES: PILOT has one
    queue, so only `default`."""

    task_class = PilotTask
    supports_defer = True
    supports_async_task = True  # run with asgiref's async_to_sync in the worker
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]: unknown OPTIONS {unknown}; "
                                       f"PilotTaskBackend takes {list(OPTIONS)}")
        if self.queues != {"default"}:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]: PILOT runs every task on its own queue; leave QUEUES "
                "out (or ['default'])")
        connect()

    def validate_task(self, task: Task) -> None:
        """Django's checks, then PILOT's: a PilotTask (made by `@task` with this
        backend), a module path that is a workflow name (dotted lowercase words,
        at most 100 characters), key fields that are named parameters. Registers
        the task's workflow."""
        super().validate_task(task)
        if not isinstance(task, PilotTask):
            raise InvalidTask(f"{task.module_path}: define it with @task on this backend")
        if len(task.module_path) > 100 or not NAME_RE.match(task.module_path):
            raise InvalidTask(f"{task.module_path!r} cannot name a PILOT workflow: a task's "
                              "module path must be dotted lowercase words (a-z, 0-9, _), "
                              "at most 100 characters")
        if not all(isinstance(f, str) for f in task.key_fields):
            raise InvalidTask(f"{task.module_path}: key_fields must be argument names")
        named = {p.name for p in _parameters(task)
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        missing = [f for f in task.key_fields if f not in named]
        if missing or len(set(task.key_fields)) != len(task.key_fields):
            raise InvalidTask(f"{task.module_path}: key_fields {list(task.key_fields)} must "
                              f"name distinct parameters of the function ({sorted(named)})")
        try:
            workflow_for(task)
        except ImproperlyConfigured as exc:  # the registry's refusal (max_attempts, ...)
            raise InvalidTask(str(exc)) from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Trigger `task` with these arguments through PILOT's idempotent trigger
        (module docstring); the TaskResult of the task it created or found.
        Raises TypeError for arguments the function does not take or that are
        not JSON, and PILOT's errors (ValidationFailed, IdempotencyKeyReused,
        TaskCancelled, ...) for what the trigger refuses. Inside a transaction
        the task is written with it and runs only once it commits."""
        self.validate_task(task)
        positional, named = _arguments(task, args, kwargs)
        name = task.module_path
        key = None
        if task.key_fields:  # type: ignore[attr-defined]  # a PilotTask: validated
            key = derive_key(name, task.key_fields, named)  # type: ignore[attr-defined]
        outcome = task_trigger(owner=self._owner(), workflow=name,
                               payload={"args": positional, "kwargs": named},
                               key=key or f"task-{uuid.uuid4().hex}", source=Source.TASKS,
                               run_after=task.run_after, priority=task.priority)
        return self.get_result(str(outcome.task.pk))

    def get_result(self, result_id: Any) -> TaskResult:
        """The TaskResult of PILOT task `result_id` (two queries);
        TaskResultDoesNotExist for an unknown id or a task that is no Django
        task."""
        found = task_with_attempts(result_id)
        workflow = registry.find(found[0].workflow) if found else None
        if found is None or not isinstance(workflow, TaskWorkflow):
            raise TaskResultDoesNotExist(f"no Django task has the id {result_id!r}")
        row, attempts = found
        claims = [t for t in attempts if t.transition == "claim"]
        task = workflow.task.using(priority=row.priority, run_after=row.run_after)
        result: TaskResult = TaskResult(
            task=task, id=str(row.pk), status=STATUS[row.state], enqueued_at=row.created_at,
            started_at=row.started_at, finished_at=row.finished_at,
            last_attempted_at=claims[-1].at if claims else None,
            args=row.payload.get("args", []), kwargs=row.payload.get("kwargs", {}),
            backend=self.alias, errors=_errors(row, attempts),
            worker_ids=[t.actor.removeprefix("worker:") for t in claims])
        if row.state == TaskState.SUCCEEDED:
            object.__setattr__(result, "_return_value", row.result)
        return result

    def _owner(self) -> Any:
        name = self.options.get("OWNER")
        try:
            return tasks_owner_get(name)
        except LookupError as exc:
            raise ImproperlyConfigured(f"TASKS[{self.alias!r}]['OPTIONS']['OWNER']: "
                                       f"{exc}") from None


def _parameters(task: Task) -> list[inspect.Parameter]:
    """The function's parameters a caller passes (without the context)."""
    parameters = list(inspect.signature(task.func).parameters.values())
    return parameters[1:] if task.takes_context else parameters


def _arguments(task: Task, args: Any, kwargs: Any) -> tuple[list, dict]:
    """The call's arguments bound to the function's parameters: everything that
    can go by name goes by name (a positional-or-keyword parameter stays
    positional only when `*args` values follow it), as JSON. TypeError for a
    call the function would refuse or a value that is not JSON."""
    parameters = _parameters(task)
    try:
        bound = inspect.Signature(parameters).bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{task.module_path}: {exc}") from None
    values = bound.arguments
    varargs = any(p.kind is p.VAR_POSITIONAL and values.get(p.name) for p in parameters)
    positional: list = []
    named: dict = {}
    for p in parameters:
        if p.name not in values:
            continue
        value = values[p.name]
        if p.kind is p.VAR_POSITIONAL:
            positional.extend(value)
        elif p.kind is p.VAR_KEYWORD:
            named.update(value)
        elif p.kind is p.POSITIONAL_ONLY or (p.kind is p.POSITIONAL_OR_KEYWORD and varargs):
            positional.append(value)
        else:
            named[p.name] = value
    try:
        return normalize_json(positional), normalize_json(named)  # type: ignore[return-value]  # a list, a dict
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{task.module_path}: arguments must be JSON ({exc})") from None


def _errors(row: Any, attempts: list) -> list[TaskError]:
    """One TaskError per attempt the function failed, from the audit trail:
    PILOT keeps each failure's exception type and the last one's message (as
    the traceback), not the tracebacks."""
    failures = [t for t in attempts if t.transition != "claim"]
    errors = []
    for index, failure in enumerate(failures):
        type_name = failure.reason.split(";", 1)[0].strip() or "Exception"
        last = index == len(failures) - 1
        errors.append(TaskError(exception_class_path=_class_path(type_name),
                                traceback=(row.error if last and row.error else failure.reason)))
    return errors


def _class_path(type_name: str) -> str:
    """The dotted path of the exception class PILOT recorded by name: a
    builtin's, or one of the step errors `workflows.sdk` exports; otherwise the
    name alone (PILOT does not record a class's module)."""
    import builtins

    from workflows.rules import errors

    for module in (builtins, errors):
        found = getattr(module, type_name, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            return f"{found.__module__}.{found.__qualname__}"
    return type_name


# The framework's signals, from PILOT's events.
_ENQUEUED, _STARTED, _FINISHED = "enqueued", "started", "finished"
_SIGNALS = {_ENQUEUED: task_enqueued, _STARTED: task_started, _FINISHED: task_finished}
_FINISHED_STATES = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)


def _signal_for(event: str, fields: dict) -> str | None:
    if event == Event.TASK_TRIGGERED:
        return _ENQUEUED if fields.get("outcome") == "created" else None
    if event != Event.TASK_TRANSITIONED:
        return None
    if fields.get("transition") == "retry":
        return _ENQUEUED
    if fields.get("transition") == "claim":
        return _STARTED
    return _FINISHED if fields.get("to_state") in _FINISHED_STATES else None


def _on_event(event: str, fields: dict) -> None:
    """An event listener: for a Django task's trigger, claim or ending, send
    the framework's signal with the task's TaskResult (read now: the change
    has committed). A receiver's error is logged by the events module, never
    the engine's."""
    which = _signal_for(event, fields)
    if which is None:
        return
    workflow = registry.find(fields.get("workflow"))
    if not isinstance(workflow, TaskWorkflow):
        return
    backend = workflow.task.get_backend()
    try:
        result = backend.get_result(str(fields.get("task_id")))
    except TaskResultDoesNotExist:
        return  # gone already (cleaned up): nothing to tell
    _SIGNALS[which].send(sender=type(backend), task_result=result)


def connect() -> None:
    """Hook the backend into PILOT once per process: the registry's loader (a
    worker finds a task it never imported) and the events' listener (the
    framework's signals). Idempotent."""
    registry.add_loader(_load)
    add_listener(_on_event)


__all__ = ["PilotTask", "PilotTaskBackend", "TaskWorkflow", "connect", "heartbeat",
           "pilot_task_backend_alias", "task", "workflow_for"]
