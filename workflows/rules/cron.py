"""Cron arithmetic for schedules, on croniter. Pure: no database.

Two forms are accepted, both evaluated in UTC:

- 5 fields, `minute hour day-of-month month day-of-week` (classic cron:
  `*/5 * * * *` is every five minutes);
- 6 fields with **seconds first**, `second minute hour day-of-month month
  day-of-week` (`*/5 * * * * *` is every five seconds), for sub-minute periods.

Slots are whole seconds. Random fields (`R`) are refused: every scheduler must
compute the same slots, or two of them would fire different ones. Jenkins-style
hashed fields (`H`) are deterministic per schedule name and allowed.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from croniter import CroniterBadDateError, CroniterError, croniter

MAX_EXPRESSION_LENGTH = 200
_RANDOM_TOKEN = re.compile(r"[rR](\(\d+-\d+\))?(/\d+)?")
_ONE_SECOND = timedelta(seconds=1)


class CronInvalid(ValueError):
    """The expression is not one this module accepts; the message says why."""


def cron_normalize(expression, *, hash_id: str = "") -> str:
    """The expression with its whitespace collapsed, after checking that it has 5
    or 6 fields, that croniter reads it, has no random field and fires at least
    once (not `0 0 30 2 *`). Raises CronInvalid."""
    if not isinstance(expression, str):
        raise CronInvalid("the cron expression must be a string")
    fields = expression.split()
    if len(fields) not in (5, 6):
        raise CronInvalid(
            f"{expression!r} has {len(fields)} fields; use 5 (minute hour day month weekday) "
            "or 6 with seconds first (second minute hour day month weekday)")
    normalized = " ".join(fields)
    if len(normalized) > MAX_EXPRESSION_LENGTH:
        raise CronInvalid(f"the cron expression is longer than {MAX_EXPRESSION_LENGTH} "
                          "characters")
    if any(_RANDOM_TOKEN.fullmatch(token) for field in fields for token in field.split(",")):
        raise CronInvalid(f"{expression!r} has a random field (R): every scheduler must "
                          "compute the same fire times")
    try:
        _iterator(normalized, datetime(2000, 1, 1, tzinfo=UTC), hash_id).get_next(datetime)
    except CroniterBadDateError:
        raise CronInvalid(f"{expression!r} never fires") from None
    except (CroniterError, ValueError, TypeError, KeyError) as exc:
        raise CronInvalid(f"{expression!r} is not a valid cron expression: {exc}") from None
    return normalized


def cron_next(expression: str, after: datetime, *, hash_id: str = "") -> datetime:
    """The first slot strictly after `after` (an aware datetime), in UTC."""
    return _iterator(expression, after.astimezone(UTC), hash_id).get_next(datetime)


def cron_latest_slots(expression: str, *, since: datetime, now: datetime, limit: int,
                      hash_id: str = "") -> tuple[list[datetime], bool]:
    """The latest `limit` slots `s` with `since <= s <= now`, oldest first, and
    whether older slots in that range were left out. Walks backwards from `now`,
    so the cost is `limit` steps however long the range is (a schedule every
    second, down for a month, is not 2.6 million iterations)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    # Slots are whole seconds: the latest slot <= now is the one before the
    # next whole second.
    start = now.astimezone(UTC).replace(microsecond=0) + _ONE_SECOND
    iterator = _iterator(expression, start, hash_id)
    slots: list[datetime] = []
    while True:
        try:
            slot = iterator.get_prev(datetime)
        except CroniterBadDateError:  # nothing earlier within croniter's search window
            return slots[::-1], False
        if slot < since:
            return slots[::-1], False
        if len(slots) == limit:
            return slots[::-1], True
        slots.append(slot.replace(fold=0))


def cron_has_seconds(expression: str) -> bool:
    return len(expression.split()) == 6


def slot_text(slot: datetime) -> str:
    """A slot as it appears in idempotency keys: ISO 8601 in UTC, to the second
    (`2024-06-01T03:00:00Z`)."""
    return slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _iterator(expression: str, start: datetime, hash_id: str) -> croniter:
    return croniter(expression, start, second_at_beginning=cron_has_seconds(expression),
                    hash_id=hash_id or None)
