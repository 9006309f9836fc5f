"""Named events: the one door through which the engine reports what it did.

`emit("task_triggered", task_id=..., workflow=...)` writes a log record whose
message is the event name and whose `pilot` attribute holds the fields; the
formatters in `observability.logging` render it. Events that describe a
database change are emitted after commit (`emit_on_commit`), so a log line never
reports a change that rolled back.

`log_context(trace_id=...)` binds fields (typically the request's trace id) to
every event emitted inside it, in this thread or task; explicit fields win.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import types

from django.db import transaction

logger = logging.getLogger("pilot.events")

_listeners: list = []
# Never mutated in place (log_context sets a new dict), so sharing the empty
# default is safe; a MappingProxy keeps it that way.
_context: contextvars.ContextVar = contextvars.ContextVar(
    "pilot_log_context", default=types.MappingProxyType({}))


def add_listener(listener) -> None:
    """Call `listener(event, fields)` for every emitted event (metrics hook in here)."""
    if listener not in _listeners:
        _listeners.append(listener)


def current_context() -> dict:
    """The fields bound by the innermost `log_context` (empty outside one)."""
    return dict(_context.get())


@contextlib.contextmanager
def log_context(**fields):
    """Bind `fields` to every event emitted inside the block (nested blocks add
    to the outer ones). Fields set to None are left out."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items()
                                               if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def emit(event: str, *, level: int = logging.INFO, **fields) -> None:
    context = _context.get()
    if context:
        merged = dict(context)
        for name, value in fields.items():
            if value not in (None, "") or name not in merged:  # an empty value keeps the bound one
                merged[name] = value
        fields = merged
    for listener in _listeners:
        try:
            listener(event, fields)
        except Exception:  # a broken metric must never break the engine
            logger.exception("event listener failed for %s", event)
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"event": event, "pilot": fields})


def emit_on_commit(event: str, *, level: int = logging.INFO, **fields) -> None:
    """`emit` once the current transaction commits (at once outside one); never
    if it rolls back. The log context is the one in force now, not at commit."""
    context = _context.get()

    def send():
        token = _context.set(context)
        try:
            emit(event, level=level, **fields)
        finally:
            _context.reset(token)

    transaction.on_commit(send)
