import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.api.conftest import assert_problem, trigger
from workflows.api.throttling import ACTION, parse_rate

pytestmark = pytest.mark.django_db


def test_a_client_over_its_trigger_rate_gets_429_with_retry_after(api, api_b, settings):
    settings.PILOT_TRIGGER_RATE = "3/min"
    assert [trigger(api, key=f"k{i}").status_code for i in range(3)] == [202, 202, 202]
    r = trigger(api, key="k3")
    assert_problem(r, 429, "throttled")
    assert 1 <= int(r["Retry-After"]) <= 60
    assert trigger(api_b, key="theirs").status_code == 202  # limits are per client
    assert api.get("/api/v1/tasks").status_code == 200  # reads are not throttled


def test_a_batch_counts_each_item_against_the_rate(api, settings):
    settings.PILOT_TRIGGER_RATE = "5/min"
    items = [{"idempotency_key": f"b{i}", "workflow": "demo.echo"} for i in range(6)]
    r = api.post("/api/v1/tasks/batch", {"tasks": items}, format="json")
    assert_problem(r, 429, "throttled")
    assert api.post("/api/v1/tasks/batch", {"tasks": items[:5]}, format="json").status_code == 200


def test_retry_and_cancel_share_their_own_rate_and_cannot_rerun_a_workflow_past_it(
        api, api_b, settings):
    """A client at its limit must not re-run a workflow again and again through
    retry: cancel and retry have their own allowance (PILOT_ACTION_RATE)."""
    settings.PILOT_TRIGGER_RATE = "1/min"
    settings.PILOT_ACTION_RATE = "3/min"
    assert trigger(api, key="only").status_code == 202
    assert_problem(trigger(api, key="more"), 429, "throttled")
    task_id = api.get("/api/v1/tasks").json()["results"][0]["id"]
    assert api.post(f"/api/v1/tasks/{task_id}/cancel").status_code == 200
    assert api.post(f"/api/v1/tasks/{task_id}/retry").status_code == 202
    assert api.post(f"/api/v1/tasks/{task_id}/cancel").status_code == 200
    r = api.post(f"/api/v1/tasks/{task_id}/retry")
    body = assert_problem(r, 429, "throttled")
    assert "PILOT_ACTION_RATE" in body["detail"]
    assert 1 <= int(r["Retry-After"]) <= 60
    assert api.get(f"/api/v1/tasks/{task_id}").json()["state"] == "cancelled"  # not re-run
    # Another client's allowance is its own; a refused action used none of it.
    theirs = trigger(api_b, key="theirs").json()["id"]
    assert api_b.post(f"/api/v1/tasks/{theirs}/cancel").status_code == 200


def test_the_action_rate_is_validated_like_the_trigger_rate(settings):
    assert parse_rate("PILOT_ACTION_RATE", "600/min") == (600, 60)
    for bad in ("600", "lots/min", "10/week", "-1/s"):
        with pytest.raises(ImproperlyConfigured, match="PILOT_ACTION_RATE"):
            parse_rate(ACTION.setting, bad)


@pytest.mark.redis
def test_with_redis_the_count_is_one_round_trip_and_its_window_expires(settings):
    """The trigger's count in Redis: one MULTI/EXEC (SET NX with the window's
    expiry, INCRBY), not Django's EXISTS + INCR (+ ADD for a window's first):
    the counter is exact, readable through the cache API, and goes away with its
    window."""
    from unittest import mock

    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache
    from redis.client import Pipeline

    from workflows.api.throttling import _consume

    cache = caches["default"]
    if not isinstance(cache, RedisCache):
        pytest.fail("REDIS_URL is set but the default cache is not Redis")
    prefix = f"t-{id(settings)}"
    with mock.patch.object(Pipeline, "execute", autospec=True,
                           side_effect=Pipeline.execute) as executed:
        assert [_consume(prefix, 2, 5, 60) for _ in range(2)] == [None, None]
        refused = _consume(prefix, 2, 5, 60)
    assert executed.call_count == 3  # one round trip per count
    assert refused is not None and 1.0 <= refused <= 60  # 6 > 5: wait for the next window
    window = int(__import__("time").time() // 60)
    key = cache.make_and_validate_key(f"{prefix}:{window}")
    assert cache.get(f"{prefix}:{window}") == 4  # the refused 2 were given back
    assert 0 < cache._cache.get_client(key).ttl(key) <= 61
