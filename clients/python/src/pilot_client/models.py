"""What the client returns: plain dataclasses over the API's JSON.

Each keeps the whole JSON object in `.raw`, so fields a newer server adds are
readable before this package knows them."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

FINISHED_STATES = frozenset({"succeeded", "failed", "cancelled"})


def _when(value: Any) -> datetime | None:
    if not value:
        return None
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    return datetime.fromisoformat(text)


@dataclasses.dataclass(frozen=True)
class Step:
    index: int
    name: str
    state: str
    attempts: int
    output: Any
    error: str
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def from_json(cls, data: dict) -> Step:
        return cls(index=data.get("index", 0), name=data.get("name", ""),
                   state=data.get("state", ""), attempts=data.get("attempts", 0),
                   output=data.get("output"), error=data.get("error") or "",
                   started_at=_when(data.get("started_at")),
                   finished_at=_when(data.get("finished_at")))


@dataclasses.dataclass(frozen=True)
class Task:
    """One run of one workflow for one idempotency key (`GET /api/v1/tasks/{id}`)."""

    id: str
    idempotency_key: str
    workflow: str
    state: str
    payload: Any
    result: Any
    error: str
    error_type: str
    attempts: int
    max_attempts: int
    replays: int
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    expires_at: datetime | None
    next_attempt_at: datetime | None
    steps: tuple[Step, ...]
    raw: dict = dataclasses.field(repr=False, compare=False)
    # What a `waiting` task waits for ({"kind", "name"?, "until"?}), else None.
    waiting_for: dict | None = None
    run_after: datetime | None = None
    priority: int = 0
    signals: tuple[Signal, ...] = ()
    # The version of its workflow it runs; its parent (a child task) or None;
    # how many child tasks its steps started (`PilotClient.list(parent=...)`).
    version: int = 1
    parent: str | None = None
    children_count: int = 0

    @property
    def finished(self) -> bool:
        """Succeeded, failed or cancelled: nothing more will happen unless retried."""
        return self.state in FINISHED_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"

    @classmethod
    def from_json(cls, data: dict) -> Task:
        return cls(
            id=str(data["id"]), idempotency_key=data.get("idempotency_key", ""),
            workflow=data.get("workflow", ""), state=data.get("state", ""),
            payload=data.get("payload"), result=data.get("result"),
            error=data.get("error") or "", error_type=data.get("error_type") or "",
            attempts=data.get("attempts", 0), max_attempts=data.get("max_attempts", 0),
            replays=data.get("replays", 0), created_at=_when(data.get("created_at")),
            started_at=_when(data.get("started_at")),
            finished_at=_when(data.get("finished_at")),
            expires_at=_when(data.get("expires_at")),
            next_attempt_at=_when(data.get("next_attempt_at")),
            steps=tuple(Step.from_json(s) for s in data.get("steps") or ()),
            raw=dict(data), waiting_for=data.get("waiting_for"),
            run_after=_when(data.get("run_after")), priority=data.get("priority") or 0,
            signals=tuple(Signal.from_json(s) for s in data.get("signals") or ()),
            version=data.get("version") or 1, parent=data.get("parent"),
            children_count=data.get("children_count") or 0)


@dataclasses.dataclass(frozen=True)
class Signal:
    """A signal sent to a task: kept until a wait step consumes it."""

    name: str
    payload: Any
    received_at: datetime | None
    consumed_at: datetime | None

    @classmethod
    def from_json(cls, data: dict) -> Signal:
        return cls(name=data.get("name", ""), payload=data.get("payload"),
                   received_at=_when(data.get("received_at")),
                   consumed_at=_when(data.get("consumed_at")))


@dataclasses.dataclass(frozen=True)
class SignalResult:
    """The answer to one signal: `replayed` when this key had already sent it
    (200, `Idempotent-Replayed: true`), else a new signal (202)."""

    signal: Signal
    replayed: bool
    status: int
    key: str


@dataclasses.dataclass(frozen=True)
class TriggerResult:
    """The answer to one trigger.

    `replayed` is the server's `Idempotent-Replayed` header: True when this key
    already had a task and nothing new was started (including when the client
    itself re-sent the request after losing the first answer). `status` is 202
    for a new or restarted run, 200 for a replay. `key` is the idempotency key
    sent (generated when none was given: keep it to trigger the same run again),
    `attempts` how many HTTP requests it took."""

    task: Task
    replayed: bool
    status: int
    key: str
    attempts: int = 1

    @property
    def task_id(self) -> str:
        return self.task.id

    @property
    def created(self) -> bool:
        """A new (or restarted) run was started by this trigger."""
        return not self.replayed


@dataclasses.dataclass(frozen=True)
class BatchItemResult:
    """One item of `batch()`, in input order: `task` and `replayed` when it was
    accepted, `error` (a typed PilotAPIError, not raised) when it was refused."""

    status: int
    key: str
    task: Task | None = None
    replayed: bool = False
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
