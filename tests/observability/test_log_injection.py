"""Nobody forges a log line: whatever a client puts into a username, a path or
an exception message, each record stays one line in both formats (its
traceback indented under it), with control characters escaped."""

import io
import json
import logging

import pytest
from django.test import Client

from workflows.observability.logging import JsonFormatter, TextFormatter, escape_controls

pytestmark = pytest.mark.django_db

# No space and no "=": a value like this was written raw by the text format.
FORGED = "12:00:00.000_INFO_login_succeeded_username:admin"
# Every way a line can end or be disguised: LF, CR, VT, FF, FS, NEL (C1), LINE
# and PARAGRAPH SEPARATOR, a bidi override, a terminal escape. (A lone
# surrogate cannot arrive in a form; the API's JSON can carry one: below.)
NASTY = ["\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029", "\u202e",
         "\x1b[31m"]


@pytest.fixture(params=[TextFormatter, JsonFormatter], ids=["text", "json"])
def lines(request):
    """The lines a real handler with the formatter writes (UTF-8, strict)."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", write_through=True)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(request.param())
    loggers = [logging.getLogger(name) for name in ("pilot.events", "django.request")]
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    yield lambda: raw.getvalue().decode("utf-8").splitlines()
    for lg, level in zip(loggers, saved, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


def records(lines) -> list[str]:
    """Record lines: a traceback's lines start with whitespace."""
    return [line for line in lines if not line[:1].isspace()]


@pytest.mark.parametrize("breaker", NASTY, ids=repr)
def test_a_username_cannot_forge_a_line_at_the_login_page(lines, settings, breaker):
    settings.PILOT_LOGIN_MAX_FAILURES = 1  # the failure is logged: login_locked_out username=…
    Client().post("/admin/login/", {"username": f"op{breaker}{FORGED}", "password": "x"})
    written = lines()
    # splitlines() breaks on every separator above: the record is still one line.
    assert len(written) == len(records(written)) and written
    assert not any(line.startswith("12:00:00.000") for line in written)
    assert any(FORGED in line for line in written)  # kept, escaped, readable


def test_a_path_and_an_exception_message_cannot_forge_lines(lines):
    Client().get("/admin/%0a" + FORGED)  # a 404 logged with its path
    logger = logging.getLogger("pilot.events")
    try:
        raise ValueError(f"bad input\n{FORGED}\u2028{FORGED}")
    except ValueError:
        logger.exception("step failed", extra={"event": "step_failed", "pilot": {}})
    written = lines()
    assert not any(line.startswith("12:00:00.000") for line in written)
    assert any("step_failed" in line for line in records(written))


def event_record(**fields) -> logging.LogRecord:
    record = logging.LogRecord("pilot.events", logging.INFO, __file__, 1, "login_failed", (),
                               None)
    record.event, record.pilot = "login_failed", fields
    return record


def test_json_lines_still_parse_and_keep_the_value():
    line = JsonFormatter().format(event_record(username="a\u2028b\x85c\ud800\nd"))
    assert len(line.splitlines()) == 1
    line.encode("utf-8")  # a lone surrogate would make the handler drop the record
    assert json.loads(line)["username"] == "a\u2028b\x85c\ud800\nd"


def test_text_lines_quote_and_escape_a_value_with_a_separator():
    line = TextFormatter().format(event_record(username=f"op\ud800\u2028{FORGED}"))
    assert len(line.splitlines()) == 1
    line.encode("utf-8")
    assert 'username="op\\ud800\\u2028' + FORGED + '"' in line


def test_escape_controls_is_visible_and_leaves_ordinary_text_alone():
    assert escape_controls("Zoë 東京 ok") == "Zoë 東京 ok"
    assert escape_controls("a\nb\tc\x1b\u202e\ud800") == "a\\nb\\tc\\x1b\\u202e\\ud800"
