"""Human durations and times for commands, settings and reasons: `0s`, `90s`, `15m`,
`12h`, `7d`, `2w`; `2026-12-01T19:50:11.001Z`. Pure."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_PATTERN = re.compile(r"^\s*(\d{1,9})\s*([smhdw])\s*$")


def duration_parse(text: str) -> timedelta:
    """`"15m"` → timedelta(minutes=15). A whole number and one unit (s, m, h, d,
    w); raises ValueError with the accepted forms for anything else, including
    negative or unit-less values (a bare `7` is ambiguous: seconds or days?)."""
    match = _PATTERN.match(text or "")
    if not match:
        raise ValueError(f"{text!r} is not a duration: use a whole number and a unit, "
                         "e.g. 0s, 90s, 15m, 12h, 7d, 2w")
    number, unit = match.groups()
    return timedelta(**{_UNITS[unit]: int(number)})


def iso_z(value: datetime) -> str:
    """`2026-12-01T19:50:11.001Z`: a time in a reason or message, ISO 8601 in
    UTC to the millisecond, as the console and the API show times."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
