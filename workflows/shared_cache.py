"""The shared cache (settings.CACHES["default"]: Redis or a database table),
used for advisory things only — the trigger throttle, login lockouts, the
metrics' task counts. None of them is worth failing a request for: when the
cache cannot be reached, `cache_soft` logs `cache_unavailable` and returns the
fallback, so triggers keep working through a cache outage (unthrottled) and a
scrape still answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from workflows.observability.events import emit

T = TypeVar("T")


def cache_soft(operation: str, call: Callable[[], T], fallback: T) -> T:
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - any backend failure: Redis, database
        emit("cache_unavailable", level=logging.WARNING, operation=operation,
             error=f"{type(exc).__name__}: {exc}"[:300])
        return fallback
