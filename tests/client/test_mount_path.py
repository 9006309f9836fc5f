"""PilotClient against PILOT's API mounted where a host project puts it
(docs/embedding.md: `path("pilot/api/", include("workflows.api.urls"))`), on a
live server: the base URL's path is the API root, a bare origin means the
standalone server's /api/v1."""

from __future__ import annotations

import pytest
from pilot_client import PilotAPIError, PilotClient
from pilot_client.client import api_root

from workflows.accounts import api_client_create
from workflows.models import Task


def test_a_bare_origin_is_the_standalone_servers_api_and_a_path_is_the_api_root():
    assert api_root("https://pilot.example.com") == "https://pilot.example.com/api/v1"
    assert api_root("https://pilot.example.com/") == "https://pilot.example.com/api/v1"
    assert api_root("http://shop.example/pilot/api/") == "http://shop.example/pilot/api"
    assert api_root("http://shop.example/api/v1") == "http://shop.example/api/v1"
    with pytest.raises(ValueError):
        PilotClient("https://pilot.example.com/api?x=1", "token")


@pytest.mark.urls("tests.client.mounted_urls")
@pytest.mark.django_db(transaction=True)
def test_the_client_triggers_reads_and_lists_under_a_hosts_mount_path(live_server):
    user, token = api_client_create("mounted-client")
    with PilotClient(f"{live_server.url}/tools/pilot/api", token) as pilot:
        run = pilot.trigger("demo.echo", {"n": 1}, key="mounted-1")
        assert (run.status, run.created) == (202, True)
        assert pilot.get(run.task_id).workflow == "demo.echo"
        assert [t.id for t in pilot.list()] == [run.task_id]
        assert pilot.trigger("demo.echo", {"n": 1}, key="mounted-1").replayed
    assert Task.objects.filter(owner=user).count() == 1
    # The origin alone means /api/v1, which this server does not have.
    with PilotClient(live_server.url, token) as pilot, pytest.raises(PilotAPIError) as caught:
        pilot.get(run.task_id)
    assert caught.value.status == 404
