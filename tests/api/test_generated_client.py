"""A client generated from the API schema by openapi-python-client, as an adopter
would make one, triggers a run (issue 30, point 4).

With one workflow registered (a host project with its own single workflow) the
trigger body is a one-member oneOf; when its payload was an object written
inline, the generator built that object's model name twice, refused the
duplicate and left `POST /tasks` out of the client. The payload is now the
named `AnyPayload` component (workflows/api/schema.py)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workflows.accounts import api_client_create
from workflows.models import Task
from workflows.registry import registry

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

GENERATOR = Path(sys.executable).parent / "openapi-python-client"


@pytest.fixture
def one_workflow(monkeypatch):
    """The registry as a host with one workflow of its own has it."""
    monkeypatch.setattr(registry, "_workflows", {"demo.echo": registry.get("demo.echo")})


def test_a_generated_client_has_the_trigger_and_runs_it(one_workflow, live_server, tmp_path,
                                                       monkeypatch):
    from tests.api.conftest import client_for

    schema = client_for("schema-reader").get("/api/v1/schema", {"format": "json"})
    assert schema.status_code == 200
    (tmp_path / "schema.json").write_bytes(schema.content)
    env = {**os.environ, "PATH": f"{GENERATOR.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([str(GENERATOR), "generate", "--path", "schema.json",
                           "--output-path", "generated", "--meta", "none"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "will not be generated" not in done.stdout + done.stderr, done.stdout

    monkeypatch.syspath_prepend(str(tmp_path))
    generated = importlib.import_module("generated")
    trigger = importlib.import_module("generated.api.api.tasks_trigger")
    body_type = trigger.sync_detailed.__annotations__["body"]  # the one workflow's shape
    assert body_type.__name__ == "TriggerDemoEchoRequest"
    body = body_type.from_dict({"workflow": "demo.echo", "payload": {"n": 7}})
    _, token = api_client_create("generated-client")
    with generated.AuthenticatedClient(base_url=live_server.url, token=token,
                                       prefix="Token") as client:
        response = trigger.sync_detailed(client=client, body=body, idempotency_key="gen-1")
        assert response.status_code == 202, response.content
        assert response.parsed.workflow == "demo.echo"
        again = trigger.sync_detailed(client=client, body=body, idempotency_key="gen-1")
    assert (again.status_code, again.parsed.id) == (200, response.parsed.id)
    assert Task.objects.get(pk=response.parsed.id).payload == {"n": 7}
