"""Log formatters: JSON lines for machines (the default), text for people.

Both render the `pilot` fields that `events.emit` attaches to a record, plus the
fields bound by `events.log_context`. Settings pick one with PILOT_LOG_FORMAT
(`json` | `text`); `make run` uses text.

JSON line, one per record:

    {"timestamp": "2026-11-29T18:09:36.123Z", "level": "info", "event": "step_finished",
     "trace_id": "…", "task_id": "…", "workflow": "demo.echo", "attempt": 1,
     "duration_ms": 2.1, "step": "echo", "logger": "pilot.events"}

`timestamp`, `level`, `event` and `logger` are always there; the others when
the event has them. A record that is not an event (Django, django-q2, a
warning) gets `event: "log"` and its text in `message`.

Secrets stay out: idempotency keys, payloads, results, tokens and passwords are
never rendered at INFO or above, whoever puts them into a record.

Nobody forges a line: a record is exactly one line (text: plus its traceback,
every line of which is indented), whatever a client managed to put into a
field or message (a username with a newline, a URL path with a carriage
return). Both formats escape control characters (C0, DEL, C1), the Unicode
line and paragraph separators, lone surrogates and the invisible
zero-width/bidirectional controls, which could otherwise break a line for a
log shipper or reorder it on a terminal.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

from workflows.observability.events import current_context

# Rendered first, in this order, when present.
LEADING = ("timestamp", "level", "event", "trace_id", "task_id", "workflow", "attempt",
           "duration_ms")
# Never rendered at INFO and above: they carry customer data or credentials.
SENSITIVE = frozenset({"key", "idempotency_key", "payload", "result", "output", "token",
                       "password", "authorization"})


# What may not appear raw in a log line. JSON escapes C0 itself; the rest it
# leaves alone with ensure_ascii=False.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069"
                     "\ufeff\ud800-\udfff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match: re.Match) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """`text` with every unsafe character (see module doc) as a visible escape."""
    return _UNSAFE.sub(_escape_char, text) if _UNSAFE.search(text) else text


def _json_escape_char(match: re.Match) -> str:
    return f"\\u{ord(match.group()):04x}"


def record_fields(record: logging.LogRecord) -> dict:
    """The ordered fields of one record, secrets removed, empty values dropped."""
    event = getattr(record, "event", None)
    fields = {
        "timestamp": datetime.fromtimestamp(record.created, UTC)
        .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": record.levelname.lower(),
        "event": event or "log",
    }
    extra = {**current_context(), **(getattr(record, "pilot", None) or {})}
    if event is None:
        extra["message"] = record.getMessage()
    if record.levelno >= logging.INFO:
        extra = {k: v for k, v in extra.items() if k.lower() not in SENSITIVE}
    for name in LEADING[3:]:
        if extra.get(name) not in (None, ""):
            fields[name] = extra.pop(name)
    fields |= {k: v for k, v in extra.items() if v is not None}
    fields["logger"] = record.name
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line (UTF-8, no newlines inside)."""

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        line = json.dumps(fields, default=str, ensure_ascii=False, separators=(",", ":"))
        # Unsafe characters can only be inside strings here, where \uXXXX is valid JSON.
        return _UNSAFE.sub(_json_escape_char, line) if _UNSAFE.search(line) else line


class TextFormatter(logging.Formatter):
    """`18:09:36.123 INFO  step_finished task_id=… workflow=demo.echo step=echo …`"""

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        stamp = fields.pop("timestamp")[11:23]
        level = fields.pop("level").upper()
        event = fields.pop("event")
        logger = fields.pop("logger")
        message = fields.pop("message", None)
        head = f"{stamp} {level:<7} {escape_controls(event)}" if message is None else \
            f"{stamp} {level:<7} {escape_controls(logger)}: {escape_controls(message)}"
        line = " ".join([head, *(f"{escape_controls(str(k))}={_text(v)}"
                                 for k, v in fields.items())])
        if record.exc_info:
            line += "\n" + _indented(self.formatException(record.exc_info))
        elif record.stack_info:
            line += "\n" + _indented(self.formatStack(record.stack_info))
        return line


def _indented(block: str) -> str:
    """A traceback under its record: every line indented and escaped, so no
    line of it (an exception message a client wrote) can pass for a record."""
    return "\n".join("    " + escape_controls(part) for part in block.split("\n"))


def _text(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)  # ASCII-only: every control escaped
    text = value if isinstance(value, str) else str(value)
    if text and not _UNSAFE.search(text) and " " not in text and "=" not in text \
            and '"' not in text:
        return text
    return json.dumps(text)  # quoted, ASCII-only


class ExpectedForbidden(logging.Filter):
    """On `django.request`: an expected 403 — PermissionDenied, a viewer opening
    a page their permissions do not give them — is one line saying so
    ("Forbidden (Permission denied): /admin/…"), not its traceback. An
    unexpected error keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from django.core.exceptions import PermissionDenied

        error = record.exc_info[1] if record.exc_info else None
        if getattr(record, "status_code", None) == 403 and isinstance(error, PermissionDenied):
            record.exc_info = None
            record.exc_text = None
        return True
