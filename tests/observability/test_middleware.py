"""The request trace id: from traceparent, X-Request-ID, or generated; on the
request, on the response and on every event the request emits."""

import io
import json
import logging

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from workflows.observability.events import emit
from workflows.observability.logging import JsonFormatter
from workflows.observability.middleware import TraceIdMiddleware, trace_id_for

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize("headers, expected", [
    ({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}, TRACE),
    ({"traceparent": f"00-{TRACE.upper()}-00f067aa0ba902b7-01", "X-Request-ID": "r"}, TRACE),
    ({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "X-Request-ID": "req-7"},
     "req-7"),
    ({"traceparent": "garbage", "X-Request-ID": "req-8"}, "req-8"),
])
def test_the_trace_id_comes_from_the_headers(headers, expected):
    assert trace_id_for(headers) == expected


@pytest.mark.parametrize("request_id", ["", "has space", "x" * 65, "caf\u00e9"])
def test_an_unusable_request_id_is_replaced_by_a_generated_one(request_id):
    generated = trace_id_for({"X-Request-ID": request_id})
    assert len(generated) == 32 and int(generated, 16) >= 0


def test_the_request_its_events_and_the_response_carry_it():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("pilot.events")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    seen = {}

    def view(request):
        seen["trace_id"] = request.trace_id
        emit("inside_request")
        return HttpResponse("ok")

    try:
        request = RequestFactory().get("/", HTTP_X_REQUEST_ID="req-42")
        response = TraceIdMiddleware(view)(request)
        emit("after_request")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    inside, after = (json.loads(line) for line in stream.getvalue().splitlines())
    assert seen["trace_id"] == "req-42" == response["X-Request-ID"] == inside["trace_id"]
    assert "trace_id" not in after
