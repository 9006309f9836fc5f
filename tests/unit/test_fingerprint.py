import pytest

from workflows.rules.errors import ValidationFailed
from workflows.rules.fingerprint import (
    canonical_json,
    derive_key,
    fingerprint,
    payload_depth,
)
from workflows.rules.keys import normalize_key


def test_canonical_json_sorts_keys_and_drops_whitespace():
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == '{"a":[1,{"c":3,"d":2}],"b":1}'


def test_fingerprint_ignores_key_order_but_not_values_or_workflow():
    fp = fingerprint("demo.echo", {"a": 1, "b": 2})
    assert fp == fingerprint("demo.echo", {"b": 2, "a": 1})
    assert fp != fingerprint("demo.echo", {"a": 1, "b": 3})
    assert fp != fingerprint("demo.flaky", {"a": 1, "b": 2})
    assert len(fp) == 64


def test_canonical_json_refuses_nan():
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_derived_key_depends_only_on_workflow_and_key_fields():
    k1 = derive_key("demo.sync_orders", ("batch",), {"batch": "b1", "count": 1})
    assert k1 == derive_key("demo.sync_orders", ("batch",), {"batch": "b1", "count": 99})
    assert k1 != derive_key("demo.sync_orders", ("batch",), {"batch": "b2", "count": 1})
    assert k1 != derive_key("other.flow", ("batch",), {"batch": "b1"})
    assert normalize_key(k1) == k1


def test_derived_key_needs_every_field():
    with pytest.raises(ValidationFailed) as exc:
        derive_key("w.x", ("a", "b"), {"a": 1})
    assert "b" in exc.value.errors["payload"]


def test_payload_depth_counts_nesting_without_recursion():
    assert payload_depth({}) == 1
    assert payload_depth({"a": [1, {"b": 2}]}) == 3
    deep = current = {}
    for _ in range(100_000):
        current["x"] = {}
        current = current["x"]
    assert payload_depth(deep) > 32
