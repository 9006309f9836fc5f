"""Trace context end to end (docs/tracing.md).

A trigger's W3C `traceparent` (`00-<trace id>-<parent span id>-<flags>`) is
stored on its task (`Task.traceparent`); the worker's log lines carry its
trace id, its spans (below) continue it, and its webhook deliveries send it.
Without an incoming one, the task's trace is the request's trace id (the
middleware's) with a span id of PILOT's own, flagged not sampled.

OpenTelemetry is optional. When `opentelemetry-api` is importable and the
process has a configured SDK tracer provider (`trace.set_tracer_provider(...)`,
e.g. by `opentelemetry-instrument` or the deployment's own start-up code),
PILOT records real spans:

    pilot.trigger      one per trigger call (API, batch, admin, CLI, schedule),
                       child of the incoming traceparent; its context is what
                       the tasks store, so everything below hangs off it
    pilot.claim        a worker's claim (or take-over) of a task
    pilot.step         each step body, with its checkpoint write
    pilot.compensate   each compensation body, with its record
    pilot.webhook      each delivery attempt (its context is the
                       `traceparent` header the receiver gets)

Otherwise every call here is a check of one module global and a shared
no-op context manager: the runner pays nothing measurable without it.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})"
                          r"(?:-[\x21-\x7e]*)?$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_NULL = contextlib.nullcontext()

_checked = False
_tracer = None


def traceparent_parse(value) -> tuple[str, str, str] | None:
    """(trace id, parent span id, flags) of a valid W3C traceparent, else None
    (version ff, all-zero ids, a malformed header)."""
    if not isinstance(value, str):
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if not match:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    if version == "00" and len(value.strip()) != 55:
        return None  # version 00 has exactly four fields
    return trace_id, span_id, flags


def traceparent_format(trace_id: str, span_id: str, flags: str = "00") -> str:
    return f"00-{trace_id}-{span_id}-{flags}"


def traceparent_for(incoming, trace_id: str) -> str:
    """What a task stores without a recorded trigger span: the incoming
    traceparent (normalised), else the request's trace id with a span id of our
    own (not sampled: nothing recorded it), else "" when the trace id is not a
    W3C one (an X-Request-ID)."""
    parsed = traceparent_parse(incoming)
    if parsed is not None:
        return traceparent_format(*parsed)
    if re.fullmatch(r"[0-9a-f]{32}", trace_id or "") and trace_id != _ZERO_TRACE:
        return traceparent_format(trace_id, secrets.token_hex(8), "00")
    return ""


def trace_id_of(traceparent: str) -> str:
    parsed = traceparent_parse(traceparent)
    return parsed[0] if parsed else ""


# --- OpenTelemetry, when there is one -------------------------------------------------------

def tracer():
    """The OpenTelemetry tracer, or None without a configured SDK provider.
    Decided once per process (`tracing_refresh` decides again)."""
    global _checked, _tracer
    if not _checked:
        _checked = True
        _tracer = _find_tracer()
    return _tracer


def tracing_refresh() -> None:
    """Look for a configured provider again (after one was set up)."""
    global _checked, _tracer
    _checked, _tracer = False, None


def _find_tracer():
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = trace.get_tracer_provider()
    if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        return None  # the API without an SDK configured: nothing would record
    return provider.get_tracer("pilot")


def _parent_context(traceparent: str):
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not traceparent_parse(traceparent):
        return None
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def span_traceparent(span) -> str:
    """The traceparent naming `span` (for children elsewhere: a task, a receiver)."""
    context = span.get_span_context()
    return traceparent_format(f"{context.trace_id:032x}", f"{context.span_id:016x}",
                              f"{int(context.trace_flags):02x}")


def span(name: str, *, parent: str = "", kind: str = "internal", inherit: bool = False,
         **attributes):
    """A context manager recording span `name` as a child of `parent` (a
    traceparent) — or, with `inherit`, of the span already current in this
    context when there is one (a request span of the deployment's own
    instrumentation, itself a child of the same traceparent). It yields the
    span, or None (no-op) without OpenTelemetry. An exception escaping the
    block is recorded on the span."""
    t = tracer()
    if t is None:
        return _NULL
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    current = inherit and trace.get_current_span().get_span_context().is_valid
    return t.start_as_current_span(
        name, context=None if current else _parent_context(parent),
        kind=SpanKind.CLIENT if kind == "client" else SpanKind.INTERNAL,
        attributes={f"pilot.{k}": v for k, v in attributes.items() if v is not None})


def span_record(name: str, *, parent: str, started_ns: int, **attributes) -> None:
    """Record a span that began at `started_ns` (time.time_ns()) and ends now,
    under `parent` — for work whose parent is known only once it is done (a
    claim learns its task's trace from the row it claimed)."""
    t = tracer()
    if t is None:
        return
    s = t.start_span(name, context=_parent_context(parent), start_time=started_ns,
                     attributes={f"pilot.{k}": v for k, v in attributes.items()
                                 if v is not None})
    s.end()


def span_failed(s, exc: BaseException | None = None, *, message: str = "") -> None:
    """Mark span `s` (None: nothing) as failed, by `exc` if there is one."""
    if s is None:
        return
    from opentelemetry.trace import Status, StatusCode

    if exc is not None:
        s.record_exception(exc)
    s.set_status(Status(StatusCode.ERROR, message or type(exc).__name__))


def span_set(s, **attributes) -> None:
    if s is not None:
        for key, value in attributes.items():
            if value is not None:
                s.set_attribute(f"pilot.{key}", value)


def now_ns() -> int:
    """A start time for span_record, or 0 (no clock read) without OpenTelemetry."""
    return time.time_ns() if tracer() is not None else 0


__all__ = ["now_ns", "span", "span_failed", "span_record", "span_set", "span_traceparent",
           "trace_id_of", "traceparent_for", "traceparent_format", "traceparent_parse",
           "tracer", "tracing_refresh"]
