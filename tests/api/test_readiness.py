"""/readyz answers "can this web node accept triggers?": a broker outage is a
degraded detail with a 200 (a trigger still commits; the dispatcher enqueues
it later), so a load balancer does not pull every node when Redis goes down."""

import pytest
from django.test import Client, override_settings

from tests.api.conftest import trigger

pytestmark = [pytest.mark.redis, pytest.mark.django_db]


def test_a_broker_outage_is_degraded_not_unready(api, settings, caplog):
    dead = {**settings.Q_CLUSTER, "redis": "redis://127.0.0.1:1/0"}
    with override_settings(Q_CLUSTER=dead), caplog.at_level("WARNING", logger="pilot.events"):
        ready = Client().get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "degraded",
                            "checks": {"database": True, "broker": False, "cache": True},
                            "degraded": {"broker": "unreachable"}}
    assert "127.0.0.1:1" not in ready.content.decode()  # no hosts or errors on an open page
    [logged] = [r.pilot for r in caplog.records if r.getMessage() == "readiness_degraded"]
    assert logged["component"] == "broker" and "127.0.0.1:1" in logged["error"]
    assert trigger(api).status_code == 202  # and a trigger is indeed accepted


def test_a_broker_given_as_redis_arguments_is_probed_too(settings):
    as_dict = {**settings.Q_CLUSTER, "redis": {"host": "127.0.0.1", "port": 1, "db": 0}}
    with override_settings(Q_CLUSTER=as_dict):
        assert Client().get("/readyz").json()["degraded"] == {"broker": "unreachable"}
    assert Client().get("/readyz").json()["status"] == "ok"
