"""Cron arithmetic (workflows/rules/cron.py): what is accepted, and which slots are due."""

from datetime import UTC, datetime, timedelta

import pytest

from workflows.rules.cron import (
    CronInvalid,
    cron_latest_slots,
    cron_next,
    cron_normalize,
    slot_text,
)

NOON = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def test_five_fields_are_minutes_and_six_fields_start_with_seconds():
    assert cron_next("*/5 * * * *", NOON) == NOON + timedelta(minutes=5)
    assert cron_next("*/5 * * * * *", NOON) == NOON + timedelta(seconds=5)
    assert cron_next("30 0 * * * *", NOON) == NOON + timedelta(seconds=30)


def test_whitespace_is_collapsed():
    assert cron_normalize("  */5   * * * *\t") == "*/5 * * * *"


@pytest.mark.parametrize(("expression", "reason"), [
    ("* * *", "has 3 fields"),
    ("0 0 0 1 1 * 2030", "has 7 fields"),
    ("61 * * * *", "not a valid cron expression"),
    ("every day", "has 2 fields"),
    ("0 0 30 2 *", "never fires"),
    ("R * * * *", "random field"),
    ("1,R(0-5) * * * *", "random field"),
    ("H * * * *", "not a valid cron expression"),  # hashed needs the schedule's name
    ("", "has 0 fields"),
])
def test_bad_expressions_are_refused_with_the_reason(expression, reason):
    with pytest.raises(CronInvalid, match=reason):
        cron_normalize(expression)


def test_a_non_string_is_refused():
    with pytest.raises(CronInvalid, match="must be a string"):
        cron_normalize(5)


def test_hashed_fields_are_the_same_for_one_name_and_spread_over_names():
    first = cron_next("H * * * *", NOON, hash_id="nightly")
    assert cron_next("H * * * *", NOON, hash_id="nightly") == first
    minutes = {cron_next("H * * * *", NOON, hash_id=f"job-{i}").minute for i in range(20)}
    assert len(minutes) > 5


def test_the_latest_slots_come_oldest_first_and_include_now():
    slots, more = cron_latest_slots("*/5 * * * * *", since=NOON, now=NOON + timedelta(seconds=15),
                                    limit=10)
    assert slots == [NOON + timedelta(seconds=s) for s in (0, 5, 10, 15)] and not more


def test_the_limit_keeps_the_latest_and_says_older_were_left_out():
    slots, more = cron_latest_slots("* * * * * *", since=NOON - timedelta(days=30), now=NOON,
                                    limit=3)
    assert slots == [NOON - timedelta(seconds=2), NOON - timedelta(seconds=1), NOON] and more


def test_no_slot_in_the_range_gives_nothing():
    slots, more = cron_latest_slots("0 3 * * *", since=NOON, now=NOON + timedelta(hours=1),
                                    limit=5)
    assert (slots, more) == ([], False)


def test_slot_text_is_iso_8601_utc_to_the_second():
    assert slot_text(NOON) == "2026-03-01T12:00:00Z"
    from zoneinfo import ZoneInfo

    paris = NOON.astimezone(ZoneInfo("Europe/Paris"))
    assert slot_text(paris) == "2026-03-01T12:00:00Z"
