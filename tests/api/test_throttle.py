import pytest

from tests.api.conftest import assert_problem, trigger

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
