"""Idempotency keys and request fingerprints (docs/design.md, "Idempotent trigger").
Pure: no database.

- `normalize_key` accepts a key bare (`abc-123`) or as an RFC 8941 sf-string
  (`"abc-123"`, as the IETF Idempotency-Key draft writes it); both are the same
  key. A key is 1–255 visible ASCII characters (0x21–0x7E).
- `fingerprint` is the SHA-256 of the canonical JSON of workflow + payload
  (sorted keys, no whitespace), so a re-trigger is recognised as the same
  request whatever its key order or spacing.
- `derive_key` builds a key from a workflow's `key_fields`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from workflows.errors import IdempotencyKeyInvalid, ValidationFailed

MAX_KEY_LENGTH = 255
MAX_PAYLOAD_DEPTH = 32


def canonical_json(value) -> str:
    """JSON with sorted keys and no whitespace; raises ValueError on NaN/Infinity."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def fingerprint(workflow: str, payload: dict) -> str:
    return fingerprint_of(canonical_json({"payload": payload, "workflow": workflow}))


def fingerprint_of(canonical: str) -> str:
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


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


def normalize_key(raw) -> str:
    """Return the key `raw` denotes, or raise IdempotencyKeyInvalid.

    A value that starts with a double quote must be a complete sf-string; its
    content is the key. Anything else is the key itself.
    """
    if not isinstance(raw, str):
        raise IdempotencyKeyInvalid("Idempotency key must be a string")
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


def derive_key(workflow: str, key_fields: tuple[str, ...], payload: dict) -> str:
    """The key for a keyless trigger of a workflow that declares `key_fields`:
    SHA-256 of workflow + those fields' canonical JSON. Every field must be
    present, or two different requests could collapse into one key."""
    missing = [name for name in key_fields if name not in payload]
    if missing:
        raise ValidationFailed(
            "No idempotency key was given and the payload lacks the fields the key is "
            "derived from",
            errors={"payload": {name: ["This field is required to derive the idempotency key."]
                                for name in missing}},
        )
    material = canonical_json({"fields": {name: payload[name] for name in key_fields},
                               "workflow": workflow})
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


def payload_depth(value, limit: int = MAX_PAYLOAD_DEPTH) -> int:
    """Nesting depth of a JSON value, iteratively (a hostile payload cannot blow
    the stack); stops counting past `limit`."""
    deepest = 0
    stack = [(value, 1)]
    children: Iterable[Any]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest
