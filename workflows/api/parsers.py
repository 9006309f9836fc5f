"""The only request parser: JSON, bounded in size and depth.

A body larger than the view's limit is refused with 413 `payload_too_large`
before it is read into memory; JSON that is malformed, not UTF-8, uses
NaN/Infinity or nests deeper than Python's parser can follow is a 400
`parse_error` — never a 500.
"""

from __future__ import annotations

import json

from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from workflows.conf import pilot_settings
from workflows.rules.errors import PayloadTooLarge

# Room for the envelope around the payload (workflow name, task_id, ...).
ENVELOPE_BYTES = 64 * 1024


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


class BoundedJSONParser(BaseParser):
    media_type = "application/json"

    def limit_for(self, view) -> int:
        return getattr(view, "max_body_bytes", None) or (
            pilot_settings.PILOT_MAX_PAYLOAD_BYTES + ENVELOPE_BYTES)

    def parse(self, stream, media_type=None, parser_context=None):
        context = parser_context or {}
        limit = self.limit_for(context.get("view"))
        request = context.get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        try:
            if declared and int(declared) > limit:
                raise PayloadTooLarge(f"The request body is {declared} bytes; the limit is {limit}")
        except ValueError:
            raise ParseError("Content-Length is not a number") from None
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(f"The request body exceeds {limit} bytes")
        try:
            text = raw.decode(context.get("encoding") or "utf-8")
        except (UnicodeDecodeError, LookupError):
            raise ParseError("The request body is not valid UTF-8") from None
        try:
            return json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            raise ParseError("The JSON is nested too deeply") from None
        except ValueError as exc:
            raise ParseError(f"Malformed JSON: {exc}") from None
