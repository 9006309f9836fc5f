"""The workflow registry. Pure: no database.

A workflow is Python code: an ordered list of steps plus a policy.

    from workflows.registry import define_workflow

    sync = define_workflow("acme.sync", max_attempts=5, key_fields=("batch",))

    @sync.step
    def fetch(ctx): ...

    @sync.step(atomic=True, compensation=undo_write)
    def write(ctx): ...

A workflow may also declare when it runs by itself:

    report = define_workflow("acme.report", schedule="0 3 * * *")          # payload {}
    sync = define_workflow("acme.sync", schedule=[
        Schedule("*/15 * * * *", payload={"scope": "delta"}, name="acme.sync-delta"),
        Schedule("0 2 * * *", payload={"scope": "full"}, name="acme.sync-full",
                 missed="run_once"),
    ])

Declared schedules are written to the database by `migrate` (post_migrate) and
by `schedule_workflow --sync`; see workflows.engine.schedule_definitions.

Workflows live in a `pilot_workflows` module of any installed app; the app's
`ready()` imports them all (`autodiscover`) and `validate_all` refuses a bad
definition at start-up, naming the workflow and the problem.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import OperationalError

from workflows.rules.backoff import RetryPolicy
from workflows.rules.errors import RetryableError, UnknownWorkflow

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
STEP_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,99}$")

# Transient by nature; anything else a step raises (TypeError, KeyError, ...) is a
# bug that a retry would only repeat, so it fails the task at once.
DEFAULT_RETRY_ON: tuple[type[BaseException], ...] = (
    RetryableError, ConnectionError, TimeoutError, OperationalError,
)


DEFAULT_IDEMPOTENCY_TTL = timedelta(hours=24)

# What a schedule does with slots missed while no scheduler ran (PilotSchedule.missed).
SCHEDULE_MISSED_POLICIES = ("skip", "run_once", "catch_up")
# A schedule's name is part of every key it fires (`schedule:<name>:<slot>`): no ':'.
SCHEDULE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def unknown_workflow_message(name) -> str:
    """"No workflow is registered as …", naming the setting that registers it
    when it is one of the demo workflows (workflows/demo, PILOT_DEMO_WORKFLOWS)."""
    message = f"No workflow is registered as {name!r}"
    if isinstance(name, str) and name.startswith("demo."):
        message += " (the demo workflows are registered only with PILOT_DEMO_WORKFLOWS=true)"
    return message


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A schedule declared in code (`define_workflow(..., schedule=...)`).

    `cron`: 5 fields, or 6 with seconds first (workflows.rules.cron); `payload`: the
    JSON object every run gets; `missed`: skip | run_once | catch_up; `name`:
    defaults to the workflow's name; `owner`: the username the runs belong to
    (default: the `scheduler` user)."""

    cron: str
    payload: dict = dataclasses.field(default_factory=dict)
    missed: str = "skip"
    name: str | None = None
    owner: str | None = None


# Longest a wait may be declared for (a timer, a signal's timeout): a year.
MAX_WAIT_SECONDS = 366 * 24 * 3600.0


def _seconds_from(option: Any, payload: dict, what: str) -> float | None:
    """A duration option as seconds for `payload`: a number, or a callable of
    the payload returning one (None: no duration)."""
    value = option(payload) if callable(option) else option
    if value is None:
        return None
    if not _is_number(value) or not 0 <= value <= MAX_WAIT_SECONDS:
        raise ValueError(f"{what} must be a number of seconds from 0 to {MAX_WAIT_SECONDS:.0f}, "
                         f"not {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Wait:
    """What a wait step waits for (docs/writing-workflows.md, "Waiting"): a
    durable timer (`seconds`, or `until`: a callable of the payload returning an
    aware datetime) or a signal named `signal` with an optional `timeout`.
    Durations are numbers or callables of the payload. The task parks —
    `waiting`, holding no worker — until then."""

    kind: str  # "timer" | "signal" | "children"
    seconds: Any = None
    until: Callable[[dict], datetime] | None = None
    signal: str | None = None
    timeout: Any = None
    # A children wait: the children of step `of_step` (None: every child the
    # task started), and whether a failed child is an entry of the output
    # rather than the step's failure (ChildFailed).
    of_step: str | None = None
    collect_failures: bool = False
    output: Callable[[list], Any] | None = None

    def deadline(self, payload: dict, now: datetime) -> datetime | None:
        """When the wait ends by itself for `payload`, measured from `now` (a
        database time): the timer's end, the signal's timeout, or None."""
        if self.kind == "timer" and self.until is not None:
            until = self.until(payload)
            if not isinstance(until, datetime) or until.tzinfo is None:
                raise ValueError(f"until must return an aware datetime, not {until!r}")
            return max(until, now)
        if self.kind == "children":
            return None
        seconds = _seconds_from(self.seconds if self.kind == "timer" else self.timeout,
                                payload, "seconds" if self.kind == "timer" else "timeout")
        return None if seconds is None else now + timedelta(seconds=seconds)

    def __call__(self, ctx: Any) -> Any:
        raise TypeError("a wait step has no body: the engine parks the task and wakes it")


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    func: Callable[[Any], Any]
    atomic: bool = False
    compensation: Callable[[Any], Any] | None = None
    # Is the compensation a database-only body committed with its record
    # (exactly once)? Defaults to the step's own `atomic`.
    compensation_atomic: bool = False
    # A wait step's wait (docs/writing-workflows.md, "Waiting"); None: a body to run.
    wait: Wait | None = None

    def without_compensation(self) -> Step:
        """This step as a plan may pick it when, for a payload, there is nothing
        to undo."""
        return dataclasses.replace(self, compensation=None, compensation_atomic=False)


class Workflow:
    """One registered workflow: a name, ordered steps, a policy."""

    def __init__(self, name: str, *, max_attempts: int = 3, backoff_initial: float = 1.0,
                 backoff_factor: float = 2.0, backoff_max: float = 300.0,
                 idempotency_ttl: timedelta | float = DEFAULT_IDEMPOTENCY_TTL,
                 key_fields: tuple[str, ...] | list[str] = (),
                 payload_serializer: type | None = None,
                 retry_on: tuple[type[BaseException], ...] = DEFAULT_RETRY_ON,
                 plan: Callable[[Workflow, dict], list[Step]] | None = None,
                 description: str = "",
                 schedule: str | Schedule | list[str | Schedule] | None = None,
                 max_running: int | None = None, concurrency: int | None = None,
                 version: int = 1):
        self.name = name
        # Several versions of one name may be registered at once; a trigger runs
        # the newest, a task keeps the one it was triggered on (docs/design.md,
        # "Versions").
        self.version = version
        # Fair shares (docs/design.md, "Fairness"): this workflow's own per-client
        # cap (instead of PILOT_MAX_RUNNING_PER_CLIENT), and a cap over all clients.
        self.max_running = max_running
        self.concurrency = concurrency
        if isinstance(idempotency_ttl, (int, float)) and not isinstance(idempotency_ttl, bool):
            idempotency_ttl = timedelta(seconds=idempotency_ttl)
        self.policy = RetryPolicy(max_attempts, backoff_initial, backoff_factor, backoff_max)
        # a timedelta by now, or refused by check()
        self.idempotency_ttl: timedelta = idempotency_ttl  # type: ignore[assignment]
        self.key_fields = tuple(key_fields) if isinstance(key_fields, (list, tuple)) else key_fields
        self.payload_serializer = payload_serializer
        self.retry_on = retry_on
        self.plan = plan
        self.description = description
        self.steps: list[Step] = []
        self._validate_options()
        self.schedules: tuple[Schedule, ...] = self._schedules_from(schedule)

    def __repr__(self) -> str:
        return f"<Workflow {self.name} v{self.version} steps={[s.name for s in self.steps]}>"

    @property
    def max_attempts(self) -> int:
        return self.policy.max_attempts

    def step(self, func: Callable | None = None, *, name: str | None = None,
             atomic: bool = False, compensation: Callable | None = None,
             compensation_atomic: bool | None = None):
        """Append a step; usable as `@wf.step` or `@wf.step(atomic=True, ...)`.
        `compensation_atomic` (default: `atomic`) runs the compensation inside
        the transaction that records it."""

        def register(fn: Callable) -> Callable:
            self.add_step(name or fn.__name__, fn, atomic=atomic, compensation=compensation,
                          compensation_atomic=compensation_atomic)
            return fn

        return register(func) if func is not None else register

    def add_step(self, name: str, func: Callable, *, atomic: bool = False,
                 compensation: Callable | None = None,
                 compensation_atomic: bool | None = None) -> Step:
        if not isinstance(name, str) or not STEP_NAME_RE.match(name):
            self._refuse(f"step name {name!r} must be 1-100 letters, digits, '_' or '-'")
        if any(s.name == name for s in self.steps):
            self._refuse(f"step name {name!r} is used twice")
        if not callable(func):
            self._refuse(f"step {name!r} is not callable")
        if compensation is not None and not callable(compensation):
            self._refuse(f"compensation of step {name!r} is not callable")
        if not isinstance(atomic, bool):
            self._refuse(f"atomic of step {name!r} must be True or False")
        if compensation_atomic is not None and not isinstance(compensation_atomic, bool):
            self._refuse(f"compensation_atomic of step {name!r} must be True or False")
        if compensation_atomic and compensation is None:
            self._refuse(f"step {name!r} has compensation_atomic but no compensation")
        if compensation_atomic is None:
            compensation_atomic = atomic
        step = Step(name=name, func=func, atomic=atomic, compensation=compensation,
                    compensation_atomic=compensation_atomic and compensation is not None)
        self.steps.append(step)
        return step

    def sleep(self, name: str, *, seconds: Any = None,
              until: Callable[[dict], datetime] | None = None) -> Step:
        """Append a durable timer: the task parks (`waiting`, holding no worker)
        for `seconds` — a number, or a callable of the payload — or until
        `until(payload)`, an aware datetime, by the database's clock. Its output
        is `{"until": <ISO time>}`."""
        if (seconds is None) == (until is None):
            self._refuse(f"sleep {name!r} needs exactly one of seconds= or until=")
        if until is not None and not callable(until):
            self._refuse(f"until of sleep {name!r} must be a callable of the payload")
        self._check_duration(seconds, f"seconds of sleep {name!r}")
        return self._add_wait(name, Wait("timer", seconds=seconds, until=until))

    def wait_for_signal(self, name: str, *, signal: str | None = None,
                        timeout: Any = None) -> Step:
        """Append a signal wait: the task parks until a signal named `signal`
        (default: the step's name) is sent to it (POST …/signals/<signal>,
        `signal_task`, the console) — one sent earlier is kept and consumed at
        once — and the signal's payload is the step's output. After `timeout`
        seconds (a number or a callable of the payload; None: never) the step
        fails with SignalTimeout."""
        signal = name if signal is None else signal
        if not isinstance(signal, str) or not STEP_NAME_RE.match(signal):
            self._refuse(f"signal name {signal!r} of step {name!r} must be 1-100 letters, "
                         "digits, '_' or '-'")
        self._check_duration(timeout, f"timeout of step {name!r}")
        return self._add_wait(name, Wait("signal", signal=signal, timeout=timeout))

    def wait_for_children(self, name: str, *, of_step: str | None = None,
                          collect_failures: bool = False,
                          output: Callable[[list], Any] | None = None) -> Step:
        """Append a children wait: the task parks until every child its steps
        started (`ctx.start_children`; only those of step `of_step` if given)
        has ended. Its output is their results in the order they were started.
        A failed or cancelled child fails the step with ChildFailed — unless
        `collect_failures`, when the output lists every child as `{"id",
        "state", "result", "error_type", "error"}` instead. `output`, a
        callable of that list, shapes the step's output (default: the list)."""
        if of_step is not None and not any(s.name == of_step for s in self.steps):
            self._refuse(f"wait_for_children {name!r}: of_step {of_step!r} is not an earlier "
                         "step")
        if not isinstance(collect_failures, bool):
            self._refuse(f"collect_failures of step {name!r} must be True or False")
        if output is not None and not callable(output):
            self._refuse(f"output of step {name!r} must be a callable of the gathered list")
        return self._add_wait(name, Wait("children", of_step=of_step,
                                         collect_failures=collect_failures, output=output))

    def _check_duration(self, value: Any, what: str) -> None:
        if value is None or callable(value):
            return
        if not _is_number(value) or not 0 <= value <= MAX_WAIT_SECONDS:
            self._refuse(f"{what} must be a number of seconds from 0 to "
                         f"{MAX_WAIT_SECONDS:.0f} or a callable of the payload")

    def _add_wait(self, name: str, wait: Wait) -> Step:
        step = self.add_step(name, wait)
        self.steps[-1] = step = dataclasses.replace(step, wait=wait)
        return step

    def steps_for(self, payload: dict) -> list[Step]:
        """The steps one run executes: all of them, or what `plan` picks from them
        (in order) for this payload, e.g. the first `payload["steps"]`. A plan
        may also drop a step's compensation for a payload
        (`step.without_compensation()`)."""
        if self.plan is None:
            return self.steps
        chosen = list(self.plan(self, payload))
        if not chosen or any(not self._is_own(step) for step in chosen):
            raise ValueError(f"plan of {self.name} must pick a non-empty list of its own steps")
        return chosen

    def _is_own(self, step: Step) -> bool:
        return any(step in (own, own.without_compensation()) for own in self.steps)

    def is_retryable(self, exc: BaseException) -> bool:
        retryable = getattr(exc, "retryable", None)
        if retryable is not None:
            return bool(retryable)
        return isinstance(exc, self.retry_on)

    def describe(self) -> dict:
        """A JSON-simple description (API `GET /workflows`, admin page)."""
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "steps": [{"index": i, "name": s.name, "atomic": s.atomic,
                       "compensation": getattr(s.compensation, "__name__", None),
                       "compensation_atomic": s.compensation_atomic,
                       "waits_for": None if s.wait is None else
                       {"kind": s.wait.kind, "signal": s.wait.signal,
                        "of_step": s.wait.of_step}}
                      for i, s in enumerate(self.steps)],
            "max_attempts": self.policy.max_attempts,
            "backoff": {"initial_seconds": self.policy.initial, "factor": self.policy.factor,
                        "max_seconds": self.policy.max_delay},
            "idempotency_ttl_seconds": self.idempotency_ttl.total_seconds(),
            "key_fields": list(self.key_fields),
            "max_running": self.max_running,
            "concurrency": self.concurrency,
        }

    def _schedules_from(self, option) -> tuple[Schedule, ...]:
        """The `schedule` option as Schedule specs with names filled in, checked
        without a database (the payload against the workflow happens at sync)."""
        from workflows.rules.cron import CronInvalid, cron_normalize

        if option is None:
            return ()
        items = option if isinstance(option, (list, tuple)) else [option]
        specs = []
        for item in items:
            spec = Schedule(item) if isinstance(item, str) else item
            if not isinstance(spec, Schedule):
                self._refuse("schedule must be a cron string, a Schedule or a list of them")
            spec = dataclasses.replace(spec, name=spec.name or self.name)
            if not isinstance(spec.name, str) or not SCHEDULE_NAME_RE.match(spec.name):
                self._refuse(f"schedule name {spec.name!r} must be 1-100 letters, digits, "
                             "'.', '_' or '-'")
            try:
                spec = dataclasses.replace(spec, cron=cron_normalize(spec.cron,
                                                                     hash_id=spec.name))  # type: ignore[arg-type]  # noqa: E501 - named
            except CronInvalid as exc:
                self._refuse(f"schedule {spec.name!r}: {exc}")
            if spec.missed not in SCHEDULE_MISSED_POLICIES:
                self._refuse(f"schedule {spec.name!r}: missed must be one of "
                             f"{', '.join(SCHEDULE_MISSED_POLICIES)}")
            if not isinstance(spec.payload, dict):
                self._refuse(f"schedule {spec.name!r}: payload must be a dict")
            try:
                json.dumps(spec.payload, allow_nan=False)
            except (TypeError, ValueError):
                self._refuse(f"schedule {spec.name!r}: payload must be plain JSON")
            if spec.owner is not None and (not isinstance(spec.owner, str) or not spec.owner):
                self._refuse(f"schedule {spec.name!r}: owner must be a username")
            specs.append(spec)
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            self._refuse("two schedules have the same name; name each one (Schedule(name=...))")
        return tuple(specs)

    def _refuse(self, problem: str):
        raise ImproperlyConfigured(f"workflow {self.name!r}: {problem}")

    def _validate_options(self) -> None:  # noqa: C901 - one flat list of checks
        if not isinstance(self.name, str) or not NAME_RE.match(self.name) or len(self.name) > 100:
            raise ImproperlyConfigured(
                f"workflow name {self.name!r} must be dotted lowercase words (e.g. 'acme.sync'), "
                "at most 100 characters"
            )
        p = self.policy
        if not isinstance(p.max_attempts, int) or isinstance(p.max_attempts, bool) \
                or not 1 <= p.max_attempts <= 1000:
            self._refuse("max_attempts must be an integer from 1 to 1000")
        for label, value in (("backoff_initial", p.initial), ("backoff_max", p.max_delay)):
            if not _is_number(value) or value < 0:
                self._refuse(f"{label} must be a number >= 0")
        if not _is_number(p.factor) or p.factor < 1:
            self._refuse("backoff_factor must be a number >= 1")
        if p.max_delay < p.initial:
            self._refuse("backoff_max must be >= backoff_initial")
        if not isinstance(self.idempotency_ttl, timedelta) or self.idempotency_ttl < timedelta(0):
            self._refuse("idempotency_ttl must be a timedelta (or seconds) >= 0")
        if not isinstance(self.key_fields, tuple) or not all(
                isinstance(f, str) and f for f in self.key_fields):
            self._refuse("key_fields must be a list of payload field names")
        if len(set(self.key_fields)) != len(self.key_fields):
            self._refuse("key_fields has a duplicate")
        if self.payload_serializer is not None:
            from rest_framework.serializers import BaseSerializer

            if not (isinstance(self.payload_serializer, type)
                    and issubclass(self.payload_serializer, BaseSerializer)):
                self._refuse("payload_serializer must be a DRF Serializer class")
        for label, cap in (("max_running", self.max_running),
                           ("concurrency", self.concurrency)):
            if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool)
                                    or not 1 <= cap <= 1_000_000):
                self._refuse(f"{label} must be None or an integer from 1 to 1000000")
        if not isinstance(self.version, int) or isinstance(self.version, bool) \
                or not 1 <= self.version <= 1_000_000:
            self._refuse("version must be an integer from 1 to 1000000")
        if self.plan is not None and not callable(self.plan):
            self._refuse("plan must be a callable (workflow, payload) -> steps")
        if not isinstance(self.retry_on, tuple) or not all(
                isinstance(t, type) and issubclass(t, BaseException) for t in self.retry_on):
            self._refuse("retry_on must be a tuple of exception classes")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and value not in (float("inf"), float("-inf"))


class Registry:
    def __init__(self):
        # name -> its newest version (what a trigger runs); every version by name.
        self._workflows: dict[str, Workflow] = {}
        self._versions: dict[str, dict[int, Workflow]] = {}
        # Callables name -> Workflow | None, asked for a name not registered yet:
        # workflows that register themselves when their module is imported
        # (a Django task's, workflows/django_tasks.py), so every process finds
        # them by name whether or not it imported that module.
        self._loaders: list[Callable[[str], Workflow | None]] = []

    def add_loader(self, loader: Callable[[str], Workflow | None]) -> None:
        """Ask `loader(name)` for a workflow `find` does not know (once added,
        a second add is a no-op). The loader registers what it returns."""
        if loader not in self._loaders:
            self._loaders.append(loader)

    def define(self, name: str, **options) -> Workflow:
        """Create and register a workflow; a second workflow of the same name is
        refused (ImproperlyConfigured) rather than silently replacing the first."""
        workflow = Workflow(name, **options)
        self.register(workflow)
        return workflow

    def register(self, workflow: Workflow) -> Workflow:
        versions = self._versions.setdefault(workflow.name, {})
        if workflow.version in versions:
            twice = (f"workflow {workflow.name!r} is registered twice" if workflow.version == 1
                     else f"version {workflow.version} of workflow {workflow.name!r} is "
                          "registered twice")
            raise ImproperlyConfigured(twice)
        versions[workflow.version] = workflow
        self._workflows[workflow.name] = versions[max(versions)]
        return workflow

    def unregister(self, name: str, version: int | None = None) -> None:
        """Forget workflow `name` (every version, or only `version`)."""
        versions = self._versions.get(name, {})
        for v in [version] if version is not None else list(versions):
            versions.pop(v, None)
        if versions:
            self._workflows[name] = versions[max(versions)]
        else:
            self._workflows.pop(name, None)
            self._versions.pop(name, None)

    def get(self, name) -> Workflow:
        """The newest version of the workflow called `name`; UnknownWorkflow if
        there is none."""
        workflow = self.find(name)
        if workflow is None:
            raise UnknownWorkflow(unknown_workflow_message(name))
        return workflow

    def find(self, name, version: int | None = None) -> Workflow | None:
        """The workflow called `name` — its newest version, or `version` —
        registered or brought in by a loader; None if there is none."""
        if not isinstance(name, str):
            return None
        workflow = self._workflows.get(name)
        if workflow is None and NAME_RE.match(name):
            for loader in self._loaders:
                workflow = loader(name)
                if workflow is not None:
                    break
        if workflow is None or version is None or workflow.version == version:
            return workflow
        return self._versions.get(name, {}).get(version)

    def for_task(self, task: Any) -> Workflow | None:
        """The version of its workflow `task` was triggered on (None: gone)."""
        return self.find(task.workflow, version=task.version)

    def versions(self, name: str) -> list[Workflow]:
        """Every registered version of `name`, oldest first."""
        return [w for _, w in sorted(self._versions.get(name, {}).items())]

    def registered(self, name) -> Workflow | None:
        """The workflow registered as `name`, without asking the loaders."""
        return self._workflows.get(name) if isinstance(name, str) else None

    def all(self) -> list[Workflow]:
        return sorted(self._workflows.values(), key=lambda w: w.name)

    def names(self) -> list[str]:
        return sorted(self._workflows)

    def schedules(self) -> list[tuple[Workflow, Schedule]]:
        """Every schedule declared in code, with its workflow, by schedule name."""
        return sorted(((w, s) for w in self._workflows.values() for s in w.schedules),
                      key=lambda pair: pair[1].name)  # type: ignore[arg-type, return-value]  # named

    def validate_all(self) -> None:
        for versions in self._versions.values():
            for workflow in versions.values():
                if not workflow.steps:
                    raise ImproperlyConfigured(f"workflow {workflow.name!r} (version "
                                               f"{workflow.version}) has no steps")
        seen: dict[str, str] = {}
        for workflow, spec in self.schedules():
            if spec.name in seen:
                raise ImproperlyConfigured(
                    f"schedule {spec.name!r} is declared by both {seen[spec.name]!r} and "
                    f"{workflow.name!r}")
            seen[spec.name] = workflow.name  # type: ignore[index]  # named by check()


registry = Registry()
define_workflow = registry.define


def autodiscover() -> None:
    """Import every installed app's `pilot_workflows` module, then validate."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("pilot_workflows")
    registry.validate_all()
