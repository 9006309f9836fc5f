"""Template filters of the operator console (workflows/admin/text.py does the work).

    {% load pilot_console %}
    {{ task.created_at|iso }}            2026-01-02T03:04:05Z (|iso_ms: .678 too)
    {{ task.created_at|ago:now }}        "4 min 2 s ago", the ISO time on hover
    {{ task.lease_expires_at|until:now }} "in 12 s" (or "12 s ago" once past)
    {{ seconds|secs }}                   12 ms, 1.2 s, 3 min 4 s
    {{ state|badge }}  {{ json|pretty }}  {{ step_view|step_duration:now }}
"""

from __future__ import annotations

from django import template
from django.utils.html import format_html

from workflows.admin import text

register = template.Library()


@register.filter
def iso(value):
    return text.timestamp(value, ms=False)


@register.filter
def iso_ms(value):
    return text.timestamp(value)


@register.filter
def ago(value, now):
    return text.ago(value, now)


@register.filter
def until(value, now):
    if value is None:
        return "–"
    if value >= now:
        return format_html('<span title="{}">in {}</span>', text.timestamp(value, ms=False),
                           text.duration_text(now, value))
    return text.ago(value, now)


@register.filter
def secs(value):
    return text.seconds_text(float(value or 0))


@register.filter
def since(value, now):
    """The time from `value` to `now`, bare ("4 min 2 s")."""
    return text.duration_text(value, now)


@register.filter
def badge(state):
    return text.state_badge(state)


@register.filter
def step_badge(step_view):
    """A StepView's state as a pill (its display state: cancelled, not started, …)."""
    return text.state_badge(step_view.state, step=True, label=step_view.label)


@register.filter
def pretty(value):
    return text.pretty_json(value)


@register.filter
def step_duration(step, now):
    """A StepView's duration (up to `now` while it runs)."""
    return step.duration(now)


@register.simple_tag
def pilot_api_docs_url():
    """The API docs page's URL, or "" when the project did not mount the API."""
    from django.urls import NoReverseMatch, reverse

    try:
        return reverse("pilot_api:docs")
    except NoReverseMatch:
        return ""
