"""A trace id for every request (docs/design.md, "Observability"), bound to
every event it causes.

The id comes from the W3C `traceparent` header (its trace-id part), else from
`X-Request-ID` (visible ASCII, at most 64 characters), else it is generated
(32 hex digits, the traceparent format). It is set as `request.trace_id`, and
the valid incoming traceparent (normalised) as `request.traceparent` ("" if
none) — views pass both to the engine (`task_trigger(..., trace_id=…,
traceparent=…)`), which stores them on the task so that worker events, spans
and webhook deliveries continue the trace (docs/tracing.md). The id is bound
with `events.log_context` for the request's own events, and echoed in the
response's `X-Request-ID` header so a client can quote it.

Without the middleware (a host project that left it out: `check` says so,
pilot.W020), `request_trace_id(request)` derives the same id from the
request's headers on first use and keeps it on the request, so a trigger
still records one.
"""

from __future__ import annotations

import re
import uuid

from workflows.observability.events import log_context
from workflows.observability.tracing import traceparent_format, traceparent_parse

_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,64}$")


def trace_context_for(headers) -> tuple[str, str]:
    """(trace id, normalised traceparent or "") of a request (module docstring)."""
    parsed = traceparent_parse(headers.get("traceparent", ""))
    if parsed is not None:
        return parsed[0], traceparent_format(*parsed)
    request_id = headers.get("X-Request-ID", "").strip()
    if _REQUEST_ID.match(request_id):
        return request_id, ""
    return uuid.uuid4().hex, ""


def trace_id_for(headers) -> str:
    """The request's trace id (see the module docstring)."""
    return trace_context_for(headers)[0]


def request_trace_context(request) -> tuple[str, str]:
    """The request's (trace id, traceparent): the middleware's, else derived
    now and kept on the request."""
    if not getattr(request, "trace_id", None):
        request.trace_id, request.traceparent = trace_context_for(request.headers)
    return request.trace_id, getattr(request, "traceparent", "")


def request_trace_id(request) -> str:
    """The request's trace id (request_trace_context)."""
    return request_trace_context(request)[0]


class TraceIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.trace_id, request.traceparent = trace_context_for(request.headers)
        with log_context(trace_id=request.trace_id):
            response = self.get_response(request)
        response.setdefault("X-Request-ID", request.trace_id)
        return response
