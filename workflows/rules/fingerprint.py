"""Request fingerprints and derived idempotency keys (docs/design.md, "Idempotent trigger").
Pure: no database.

- `fingerprint` is the SHA-256 of the canonical JSON of workflow + payload
  (sorted keys, no whitespace), so a re-trigger is recognised as the same
  request whatever its key order or spacing.
- `derive_key` builds a key from a workflow's `key_fields` (the key rule itself
  is workflows.rules.keys).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from workflows.rules.errors import ValidationFailed

MAX_PAYLOAD_DEPTH = 32


def canonical_json(value) -> str:
    """JSON with sorted keys and no whitespace; raises ValueError on NaN/Infinity."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def fingerprint(workflow: str, payload: dict) -> str:
    return fingerprint_of(canonical_json({"payload": payload, "workflow": workflow}))


def fingerprint_of(canonical: str) -> str:
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


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
