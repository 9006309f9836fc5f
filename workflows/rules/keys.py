"""The idempotency key rule, in one place (docs/design.md, "Idempotent trigger").
Pure: no database.

A key is 1–255 visible ASCII characters (0x21–0x7E). It may be sent bare
(`abc-123`) or as an RFC 8941 sf-string (`"abc-123"`, as the IETF
Idempotency-Key draft writes it); both are the same key. Every door — the API's
header, `task_id` and batch items, the list filter, the console's trigger form,
`manage.py trigger_workflow`, schedules — hands what it received to the engine,
which applies `normalize_key`; so the same key is accepted or refused the same
way (`idempotency_key_invalid`) whichever door it came through. `KEY_PATTERN`
and `KEY_SCHEMA` say the same rule to the OpenAPI schema
(tests/unit/test_keys.py holds them to `normalize_key`), and the Task model's
column is `MAX_KEY_LENGTH` wide.
"""

from __future__ import annotations

from typing import Any

from workflows.rules.errors import IdempotencyKeyInvalid

MAX_KEY_LENGTH = 255
# The longest value that can denote a valid key: an sf-string of MAX_KEY_LENGTH
# characters that all need an escape (`\"`, `\\`), with its two quotes.
MAX_KEY_INPUT_LENGTH = 2 + 2 * MAX_KEY_LENGTH

# A bare key (not starting with a quote) or an sf-string holding one (only \" and
# \\ escapes). The end is `(?![\s\S])`, not `$`, because Python's `$` (which test
# generators use) also matches before a final newline; both regex dialects read
# the lookahead as "end of input".
KEY_PATTERN = (rf'^(?:[\x21\x23-\x7e][\x21-\x7e]{{0,{MAX_KEY_LENGTH - 1}}}'
               rf'|"(?:[\x21\x23-\x5b\x5d-\x7e]|\\[\x22\x5c]){{1,{MAX_KEY_LENGTH}}}")(?![\s\S])')
KEY_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1,
                              "maxLength": MAX_KEY_INPUT_LENGTH, "pattern": KEY_PATTERN}


def _is_visible_ascii(text: str) -> bool:
    return all(0x21 <= ord(ch) <= 0x7E for ch in text)


def _parse_sf_string(raw: str) -> str:
    """Parse an RFC 8941 §3.3.3 sf-string (`"..."`, with `\\"` and `\\\\` escapes)."""
    out = []
    i, end = 1, len(raw) - 1
    while i < end:
        ch = raw[i]
        if ch == "\\":
            if i + 1 >= end or raw[i + 1] not in ('"', "\\"):
                raise IdempotencyKeyInvalid(
                    "Idempotency key is a malformed quoted string: only \\\" and \\\\ "
                    "escapes are allowed"
                )
            out.append(raw[i + 1])
            i += 2
            continue
        if ch == '"':
            raise IdempotencyKeyInvalid(
                "Idempotency key is a malformed quoted string: unescaped quote inside"
            )
        out.append(ch)
        i += 1
    return "".join(out)


def normalize_key(raw: object) -> str:
    """Return the key `raw` denotes, or raise IdempotencyKeyInvalid.

    A value that starts with a double quote must be a complete sf-string; its
    content is the key. Anything else is the key itself. A value longer than
    any valid key can be written is refused before it is parsed.
    """
    if not isinstance(raw, str):
        raise IdempotencyKeyInvalid("Idempotency key must be a string")
    if len(raw) > MAX_KEY_INPUT_LENGTH:
        raise IdempotencyKeyInvalid(
            f"Idempotency key is {len(raw)} characters; the limit is {MAX_KEY_LENGTH}")
    key = raw
    if key.startswith('"'):
        if len(key) < 2 or not key.endswith('"'):
            raise IdempotencyKeyInvalid(
                "Idempotency key starts with a quote but is not a complete quoted string"
            )
        key = _parse_sf_string(key)
    if not key:
        raise IdempotencyKeyInvalid("Idempotency key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise IdempotencyKeyInvalid(
            f"Idempotency key is {len(key)} characters; the limit is {MAX_KEY_LENGTH}"
        )
    if not _is_visible_ascii(key):
        raise IdempotencyKeyInvalid(
            "Idempotency key may contain only visible ASCII characters (0x21-0x7E): "
            "no spaces, control characters or non-ASCII"
        )
    return key
