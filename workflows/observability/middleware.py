"""Trace ids: one per request, from the caller when it sends one.

Taken from a W3C `traceparent` header (its trace-id part) or `X-Request-ID`
when present and sane, else generated. Stored on the request (the trigger
records it on the task), bound to the logging context, and echoed in the
`X-Request-ID` response header.
"""

from __future__ import annotations

import re
import uuid

from workflows.observability.context import trace_id_var

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,64}$")


def trace_id_from(headers) -> str:
    match = _TRACEPARENT.match((headers.get("traceparent") or "").strip().lower())
    if match and match.group(1) != "0" * 32:
        return match.group(1)
    request_id = (headers.get("X-Request-ID") or "").strip()
    if _REQUEST_ID.match(request_id):
        return request_id
    return uuid.uuid4().hex


class TraceIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.trace_id = trace_id_from(request.headers)
        token = trace_id_var.set(request.trace_id)
        try:
            response = self.get_response(request)
        finally:
            trace_id_var.reset(token)
        response["X-Request-ID"] = request.trace_id
        return response
