"""The task list's query parameters, checked before Django's ChangeList sees them.

Django's admin passes any local-field lookup in the query string to the
database (`?idempotency_key=…`, `?payload__has_key=…`), and a value the
database refuses — a NUL character, which PostgreSQL's text cannot hold, a
time zone offset beyond ±15:59, an integer beyond bigint — would be a 500 when
the page renders. So the list accepts exactly the parameters its own filters,
date links, search, ordering and pagination produce, each with a value of
the right shape; anything else is dropped with a message that names it
(`list_params_check`). The filter-wide actions and the live endpoint take
filters through the same check.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, date, timedelta

from django.http import QueryDict
from django.utils.dateparse import parse_date, parse_datetime

from workflows.admin.paging import cursor_problem
from workflows.admin.search import search_problem
from workflows.rules.states import TaskState

MAX_OFFSET = timedelta(hours=15, minutes=59)  # what PostgreSQL's timestamptz accepts
_DIGITS = re.compile(r"[0-9]{1,18}")
_SURROGATE = re.compile("[\ud800-\udfff]")

FLAGS = {"all", "e", "_facets"}  # presence matters, value does not


def _int_in(low: int, high: int):
    def check(value: str) -> str:
        if not _DIGITS.fullmatch(value) or not low <= int(value) <= high:
            return f"must be a whole number from {low} to {high}"
        return ""
    return check


def _state(value: str) -> str:
    return "" if value in TaskState.values else \
        f"must be one of {', '.join(TaskState.values)}"


def moment_problem(value: str) -> str:
    """A date or date-time PostgreSQL can compare with (year 1-9999 in UTC,
    offset within ±15:59)."""
    try:
        moment = parse_datetime(value)
        if moment is None:
            day = parse_date(value)
            if day is None:
                return "must be an ISO 8601 date or date-time"
            return ""
        offset = moment.utcoffset()
        if offset is not None:
            if abs(offset) > MAX_OFFSET:
                return "has a time zone offset beyond ±15:59"
            moment.astimezone(UTC)
    except (ValueError, OverflowError):
        return "is not a valid date-time"
    return ""


def _anything(value: str) -> str:
    return ""


def _task_id(value: str) -> str:
    try:
        uuid.UUID(value)
    except ValueError:
        return "is not a task id"
    return ""


def _workflow(value: str) -> str:
    return "is longer than 100 characters" if len(value) > 100 else ""


CHECKS = {
    "q": search_problem,
    "o": lambda v: "" if re.fullmatch(r"[0-9.\-]{0,50}", v) else "is not a column order",
    "p": _int_in(1, 10**9),
    "before": cursor_problem,
    "state__exact": _state,
    "workflow": _workflow,
    "owner": _int_in(1, 2**63 - 1),
    "waiting_for": lambda v: "" if v in ("signal", "timer", "children") else
    "is not signal, timer or children",
    "parent": _task_id,
    "version": _int_in(1, 1_000_000),
    "created_at__gte": moment_problem,
    "created_at__lt": moment_problem,
    "finished_at__gte": moment_problem,
    "finished_at__lt": moment_problem,
    # 9998: Django's date hierarchy adds a year (or 32 days) to find the range's end.
    "created_at__year": _int_in(1, 9998),
    "created_at__month": _int_in(1, 12),
    "created_at__day": _int_in(1, 31),
    **dict.fromkeys(FLAGS, _anything),
}
NAMES = frozenset(CHECKS)


def _problem(name: str, values: list[str]) -> str:
    if "\x00" in name or any("\x00" in v for v in values):
        return "contains a NUL character"
    if _SURROGATE.search(name) or any(_SURROGATE.search(v) for v in values):
        return "contains an unpaired surrogate character"
    if name not in CHECKS:
        return "is not a filter of this list"
    for value in values:
        problem = CHECKS[name](value)
        if problem:
            return problem
    return ""


def list_params_check(params: QueryDict) -> tuple[QueryDict, dict[str, str]]:
    """(the parameters that may reach the ChangeList, {name: why another was
    dropped}). Names in the problems are printable (NULs shown as \\x00)."""
    kept = QueryDict(mutable=True)
    problems: dict[str, str] = {}
    for name, values in params.lists():
        problem = _problem(name, values)
        if problem:
            shown = name.encode("unicode_escape").decode("ascii")[:60]
            problems[shown] = problem
        else:
            kept.setlist(name, values)
    _check_day(kept, problems)
    return kept, problems


def _check_day(kept: QueryDict, problems: dict) -> None:
    """The date hierarchy's year, month and day must make a real date (no
    February 30th), and a month or day needs its year."""
    parts = [kept.get(f"created_at__{p}") for p in ("year", "month", "day")]
    if not any(parts):
        return
    year, month, day = parts
    try:
        if year is None:
            raise ValueError("needs created_at__year")
        date(int(year), int(month or 1), int(day or 1))
    except ValueError:
        for part in ("year", "month", "day"):
            if kept.pop(f"created_at__{part}", None) is not None:
                problems[f"created_at__{part}"] = "is not part of a real date"


def problems_text(problems: dict[str, str]) -> str:
    return "; ".join(f"{name} {why}" for name, why in problems.items())
