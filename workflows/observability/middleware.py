"""A trace id for every request (SPEC §11), bound to every event it causes.

The id comes from the W3C `traceparent` header (its trace-id part), else from
`X-Request-ID` (visible ASCII, at most 64 characters), else it is generated
(32 hex digits, the traceparent format). It is set as `request.trace_id` —
views pass it to the engine (`task_trigger(..., trace_id=request.trace_id)`),
which stores it on the task so that worker events carry it too — bound with
`events.log_context` for the request's own events, and echoed in the
response's `X-Request-ID` header so a client can quote it.
"""

from __future__ import annotations

import re
import uuid

from workflows.observability.events import log_context

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,64}$")
_ZERO_TRACE = "0" * 32


def trace_id_for(headers) -> str:
    """The request's trace id (see the module docstring)."""
    match = _TRACEPARENT.match(headers.get("traceparent", "").strip().lower())
    if match and match.group(1) != _ZERO_TRACE:
        return match.group(1)
    request_id = headers.get("X-Request-ID", "").strip()
    if _REQUEST_ID.match(request_id):
        return request_id
    return uuid.uuid4().hex


class TraceIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.trace_id = trace_id_for(request.headers)
        with log_context(trace_id=request.trace_id):
            response = self.get_response(request)
        response.setdefault("X-Request-ID", request.trace_id)
        return response
