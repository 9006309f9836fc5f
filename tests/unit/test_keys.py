"""The idempotency key rule (workflows/rules/keys.py): the pattern the OpenAPI schema
publishes and the function every door goes through say the same thing."""

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from workflows.rules.errors import IdempotencyKeyInvalid
from workflows.rules.keys import (
    KEY_PATTERN,
    KEY_SCHEMA,
    MAX_KEY_INPUT_LENGTH,
    MAX_KEY_LENGTH,
    normalize_key,
)

PATTERN = re.compile(KEY_PATTERN)


def test_bare_and_quoted_keys_are_the_same_key():
    assert normalize_key("abc-123") == "abc-123"
    assert normalize_key('"abc-123"') == "abc-123"


def test_quoted_key_unescapes_quote_and_backslash():
    assert normalize_key(r'"a\"b\\c"') == 'a"b\\c'


@pytest.mark.parametrize("raw", [
    "", '""', " ", "has space", "tab\tkey", "é", "x" * 256, '"abc', '"a"b"', r'"a\nb"', '"',
    "\x7f", None, 17,
])
def test_invalid_keys_are_refused(raw):
    with pytest.raises(IdempotencyKeyInvalid):
        normalize_key(raw)


def test_key_limits_are_inclusive():
    assert normalize_key("x") == "x"
    assert normalize_key("~" * 255) == "~" * 255
    assert normalize_key('"' + "k" * 255 + '"') == "k" * 255



def accepted(raw: str) -> bool:
    try:
        normalize_key(raw)
    except IdempotencyKeyInvalid:
        return False
    return True


# Quotes and backslashes (the sf-string's syntax), a space, a non-ASCII letter,
# a newline, and ordinary characters, at lengths either side of every limit.
_ALPHABET = st.sampled_from(['"', "\\", " ", "é", "\n", "\x7f", "k", "~", "!"])
raw_keys = st.one_of(
    st.text(_ALPHABET, max_size=8),
    st.builds(lambda body, n: body + "k" * n, st.text(_ALPHABET, max_size=4),
              st.integers(MAX_KEY_LENGTH - 4, MAX_KEY_LENGTH + 2)),
    st.builds(lambda body, n: '"' + body + "k" * n + '"', st.text(_ALPHABET, max_size=4),
              st.integers(MAX_KEY_LENGTH - 4, MAX_KEY_LENGTH + 2)),
)


@given(raw=raw_keys)
@example(raw='"' + '\\"' * MAX_KEY_LENGTH + '"')  # the longest input a key can have
@example(raw='"' + '\\"' * (MAX_KEY_LENGTH + 1) + '"')
@example(raw="x\n")  # `$` would match before the newline
@example(raw='""')
def test_the_published_pattern_accepts_exactly_what_normalize_key_accepts(raw):
    assert bool(PATTERN.match(raw)) == accepted(raw)


def test_the_longest_quoted_key_is_the_input_limit():
    longest = '"' + '\\"' * MAX_KEY_LENGTH + '"'
    assert len(longest) == MAX_KEY_INPUT_LENGTH == KEY_SCHEMA["maxLength"]
    assert normalize_key(longest) == '"' * MAX_KEY_LENGTH


@pytest.mark.parametrize("raw", ["k" * (MAX_KEY_INPUT_LENGTH + 1),
                                 # malformed too: the length is what is reported
                                 '"' + "k" * MAX_KEY_INPUT_LENGTH + '\\n"'])
def test_an_input_longer_than_any_key_is_refused_before_it_is_parsed(raw):
    with pytest.raises(IdempotencyKeyInvalid, match=f"the limit is {MAX_KEY_LENGTH}"):
        normalize_key(raw)
