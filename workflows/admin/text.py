"""Small formatting helpers shared by the console's pages (no database)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from django.contrib import admin
from django.utils.html import format_html
from django.utils.safestring import SafeString

from workflows.admin.svg import STATE_COLORS, STEP_COLORS


def duration_text(start: datetime | None, end: datetime | None) -> str:
    """`1.2 s`, `3 min 4 s`, `2 h 5 min`, `3 d 4 h`; "–" when a bound is missing."""
    if start is None or end is None:
        return "–"
    seconds = max((end - start).total_seconds(), 0.0)
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


def timestamp(value: datetime | None) -> str:
    """UTC to the millisecond: operators compare events a few ms apart."""
    if value is None:
        return "–"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def timestamp_field(attname: str, description: str):
    """A read-only admin field (a ModelAdmin/inline attribute) showing the
    datetime `attname` through `timestamp`."""
    @admin.display(description=description)
    def show(model_admin, obj):
        return timestamp(getattr(obj, attname))

    return show


def state_badge(state: str, *, step: bool = False) -> SafeString:
    """A coloured pill; the colour comes from the one palette in `svg`."""
    colour = (STEP_COLORS if step else STATE_COLORS).get(state, "#6b7280")
    return format_html('<span class="pilot-badge pilot-state-{}" style="background:{}">{}</span>',
                       state, colour, state)


def pretty_json(value) -> SafeString:
    """Indented, key-sorted JSON in a <pre>; escaped, so payloads cannot inject markup."""
    if value is None:
        return format_html('<span class="pilot-muted">{}</span>', "null")
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    return format_html('<pre class="pilot-json">{}</pre>', text)
