"""Small formatting helpers shared by the console's pages (no database).

Times are ISO 8601 in UTC with seconds everywhere (milliseconds where events a
few ms apart must stay in order); durations say milliseconds below a second,
so a short step reads "12 ms", never "0.0 s".
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from django.contrib import admin
from django.utils.html import format_html
from django.utils.safestring import SafeString

from workflows.admin.pictures.svg import STATE_COLORS, STEP_COLORS


def seconds_text(seconds: float) -> str:
    """`12 ms`, `1.2 s`, `42 s`, `3 min 4 s`, `2 h 5 min`, `3 d 4 h`."""
    seconds = max(seconds, 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def duration_text(start: datetime | None, end: datetime | None) -> str:
    """The time from `start` to `end` as `seconds_text`; "–" when a bound is missing."""
    if start is None or end is None:
        return "–"
    return seconds_text((end - start).total_seconds())


def ttl_text(ttl: timedelta | float) -> str:
    """An idempotency TTL as a duration in whole units: `24 h`, `7 d`, `15 min`."""
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)
    if seconds >= 2 * 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:.0f} d"
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f} {unit}"
    return seconds_text(seconds)


def timestamp(value: datetime | None, *, ms: bool = True) -> str:
    """`2026-01-02T03:04:05.678Z`: ISO 8601 in UTC, to the millisecond unless
    `ms` is False (operators compare events a few ms apart)."""
    if value is None:
        return "–"
    text = value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return (text[:-3] if ms else text[:-7]) + "Z"


def ago(value: datetime | None, now: datetime) -> SafeString | str:
    """"4 min 2 s ago" with the ISO time on hover."""
    if value is None:
        return "–"
    return format_html('<span title="{}">{} ago</span>', timestamp(value, ms=False),
                       duration_text(value, now))


def timestamp_field(attname: str, description: str):
    """A read-only admin field (a ModelAdmin/inline attribute) showing the
    datetime `attname` through `timestamp`."""
    @admin.display(description=description)
    def show(model_admin, obj):
        return timestamp(getattr(obj, attname))

    return show


def state_badge(state: str, *, step: bool = False, label: str | None = None) -> SafeString:
    """A coloured pill; the colour comes from the one palette in `svg`."""
    colour = (STEP_COLORS if step else STATE_COLORS).get(state, "#6b7280")
    return format_html('<span class="pilot-badge pilot-state-{}" style="background:{}">{}</span>',
                       state, colour, label or state)


def pretty_json(value) -> SafeString:
    """Indented, key-sorted JSON in a <pre>; escaped, so payloads cannot inject
    markup. Long values scroll inside the box instead of widening the page."""
    if value is None:
        return format_html('<span class="pilot-muted">{}</span>', "null")
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    return format_html('<pre class="pilot-json">{}</pre>', text)


def count_text(n: int, exact: bool = True) -> str:
    """An exact count as is; an estimate rounded to what it is worth and said
    to be one: "about 12 000", "about 8.6 M"."""
    if exact:
        return str(n)
    if n >= 1_000_000:
        return f"about {n / 1_000_000:.1f} M"
    shown = round(n, 2 - len(str(n)))  # two significant digits
    return f"about {shown:,}".replace(",", " ")
