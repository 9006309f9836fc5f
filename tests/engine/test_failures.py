"""The failed attempts' log: bounded, redacted tracebacks (engine/failures.py)."""

from datetime import UTC, datetime

from workflows.engine import failures

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def raised(exc_factory, depth=0):
    def dive(n):
        if n == 0:
            raise exc_factory()
        dive(n - 1)

    try:
        dive(depth)
    except Exception as exc:  # noqa: BLE001 - the test keeps whatever it raised
        return exc
    raise AssertionError("unreachable")


def test_an_entry_keeps_type_message_and_traceback():
    exc = raised(lambda: ValueError("no such merchant 42"))
    entry = failures.entry(exc, attempt=3, at=AT)
    assert entry["attempt"] == 3 and entry["at"] == "2026-01-02T03:04:05+00:00"
    assert (entry["type"], entry["message"]) == ("ValueError", "no such merchant 42")
    assert entry["traceback"].startswith("Traceback (most recent call last)")
    assert entry["traceback"].rstrip().endswith("ValueError: no such merchant 42")
    assert "in dive" in entry["traceback"]


def test_the_traceback_keeps_the_last_frames_and_at_most_8_kb():
    exc = raised(lambda: RuntimeError("deep " + "x" * 300), depth=200)
    text = failures.traceback_text(exc)
    assert text.count("in dive") <= failures.TRACEBACK_FRAMES
    assert len(text) <= failures.TRACEBACK_CHARS
    assert text.rstrip().endswith("x" * 300)  # the end, where the error is, is kept


def test_credentials_are_masked_in_message_and_traceback():
    exc = raised(lambda: ConnectionError("cannot reach postgres://pilot:s3cret@db/pilot"
                                         "?sslmode=x&password=hunter2"))
    entry = failures.entry(exc, attempt=1, at=AT)
    for text in (entry["message"], entry["traceback"]):
        assert "s3cret" not in text and "hunter2" not in text
        assert "postgres://pilot:********@db/pilot" in text


def test_a_long_message_is_cut_and_the_log_keeps_the_last_ten():
    entry = failures.entry(ValueError("m" * 5000), attempt=1, at=AT)
    assert len(entry["message"]) == failures.MESSAGE_CHARS
    log: list = []
    for n in range(1, 14):
        log = failures.appended(log, {"attempt": n})
    assert [e["attempt"] for e in log] == list(range(4, 14))
    assert failures.appended(None, {"attempt": 1}) == [{"attempt": 1}]
