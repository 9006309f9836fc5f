"""Named events: the one door through which the engine reports what it did.

`emit("task_triggered", task_id=..., workflow=...)` writes a log record whose
message is the event name and whose `pilot` attribute holds the fields; the
formatters in `observability.logging` render it. Events that describe a
database change are emitted after commit (`emit_on_commit`), so a log line never
reports a change that rolled back.
"""

from __future__ import annotations

import logging

from django.db import transaction

logger = logging.getLogger("pilot.events")

_listeners: list = []


def add_listener(listener) -> None:
    """Call `listener(event, fields)` for every emitted event (metrics hook in here)."""
    if listener not in _listeners:
        _listeners.append(listener)


def emit(event: str, *, level: int = logging.INFO, **fields) -> None:
    for listener in _listeners:
        try:
            listener(event, fields)
        except Exception:  # a broken metric must never break the engine
            logger.exception("event listener failed for %s", event)
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"event": event, "pilot": fields})


def emit_on_commit(event: str, *, level: int = logging.INFO, **fields) -> None:
    transaction.on_commit(lambda: emit(event, level=level, **fields))
