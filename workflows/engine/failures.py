"""The failed attempts' log of a step (docs/design.md, "Checkpoints"): each
failed attempt keeps its exception type, message and a bounded traceback, so
"why did it fail?" has the whole answer in the console and the API.

An entry is written only on failure, in the same write that records it (the
failed step row carries the whole log: what the plan read, plus this one,
the last FAILURES_KEPT). The traceback is the last TRACEBACK_FRAMES frames,
cut to its last TRACEBACK_CHARS characters, and redacted like the debug
pages (workflows/debug.py: passwords inside URLs, credential query
parameters). Frame locals are never kept.
"""

from __future__ import annotations

import traceback
from datetime import datetime
from typing import Any

from workflows.debug import mask_url_credentials

FAILURES_KEPT = 10
TRACEBACK_FRAMES = 30
TRACEBACK_CHARS = 8 * 1024
MESSAGE_CHARS = 2000


def traceback_text(exc: BaseException) -> str:
    """The last TRACEBACK_FRAMES frames of `exc` and its chained causes, at
    most TRACEBACK_CHARS characters (the end, where the error is), redacted."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__,
                                       limit=-TRACEBACK_FRAMES)
    text = mask_url_credentials("".join(lines))
    if len(text) > TRACEBACK_CHARS:
        text = "…\n" + text[-(TRACEBACK_CHARS - 2):]
    return text


def entry(exc: BaseException, *, attempt: int, at: datetime) -> dict[str, Any]:
    message = mask_url_credentials(str(exc))
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS - 1] + "…"
    return {"attempt": attempt, "at": at.isoformat(), "type": type(exc).__name__,
            "message": message, "traceback": traceback_text(exc)}


def appended(stored: list[dict[str, Any]] | None, new: dict[str, Any]) -> list[dict[str, Any]]:
    """The log as it is written: `stored` (what the plan read) plus `new`,
    the last FAILURES_KEPT."""
    return [*(stored or []), new][-FAILURES_KEPT:]


__all__ = ["FAILURES_KEPT", "TRACEBACK_CHARS", "TRACEBACK_FRAMES", "appended", "entry",
           "traceback_text"]
