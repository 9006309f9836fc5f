"""The OpenAPI schema tells the truth, and the docs UI is served locally."""

import re

import pytest
import yaml
from django.contrib.staticfiles import finders

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema(api):
    r = api.get("/api/v1/schema")
    assert r.status_code == 200
    return yaml.safe_load(r.content)


def test_every_endpoint_is_documented(schema):
    assert set(schema["paths"]) == {
        "/api/v1/tasks", "/api/v1/tasks/batch", "/api/v1/tasks/{task_id}",
        "/api/v1/tasks/{task_id}/cancel", "/api/v1/tasks/{task_id}/retry",
        "/api/v1/tasks/{task_id}/signals/{name}", "/api/v1/workflows", "/healthz", "/readyz"}


def test_the_signal_documents_its_key_its_replay_and_every_error(schema):
    post = schema["paths"]["/api/v1/tasks/{task_id}/signals/{name}"]["post"]
    [header] = [p for p in post["parameters"] if p["name"] == "Idempotency-Key"]
    assert header["in"] == "header" and header["required"] is True
    assert {"200", "202", "400", "404", "409", "422"} <= set(post["responses"])
    assert "task_finished" in post["responses"]["409"]["description"]
    task = schema["components"]["schemas"]["Task"]["properties"]
    assert {"waiting_for", "signals"} <= set(task)


def test_the_trigger_documents_the_key_header_its_limits_and_every_error(schema):
    post = schema["paths"]["/api/v1/tasks"]["post"]
    [header] = [p for p in post["parameters"] if p["name"] == "Idempotency-Key"]
    assert header["in"] == "header"
    assert "1-255 visible ASCII" in header["description"]
    assert "RFC 8941" in header["description"]
    assert set(post["responses"]) == {"200", "202", "400", "401", "403", "409", "413", "415",
                                      "422", "429", "503"}
    problem = post["responses"]["422"]["content"]
    assert "idempotency_key_reused" in post["responses"]["422"]["description"]
    assert problem


def test_the_description_publishes_the_expiry_policy(schema):
    description = schema["info"]["description"]
    assert "idempotency_ttl" in description and "24 hours" in description
    assert "never expires" in description


def test_the_docs_page_uses_only_local_assets(api):
    r = api.get("/api/v1/docs")
    assert r.status_code == 200
    html = r.content.decode()
    assert "cdn" not in html.lower()
    assets = re.findall(r'(?:src|href)="/static/([^"]+)"', html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    for asset in assets:
        assert finders.find(asset), asset


# --- who may read them (PILOT_API_DOCS_PUBLIC) ----------------------------------------------

def test_the_schema_and_docs_need_the_apis_authentication(anon):
    body = anon.get("/api/v1/schema").json()
    assert (body["status"], body["code"]) == (401, "not_authenticated")
    assert anon.get("/api/v1/schema?format=json")["Content-Type"] == "application/problem+json"
    docs = anon.get("/api/v1/docs")
    assert docs.status_code == 302
    assert docs["Location"] == "/admin/login/?next=/api/v1/docs"


def test_a_session_reads_them_like_a_token(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("someone", password="pw-123-abc"))
    assert client.get("/api/v1/schema").status_code == 200
    assert client.get("/api/v1/docs").status_code == 200


def test_a_setting_opens_them_to_anyone(anon, settings):
    settings.PILOT_API_DOCS_PUBLIC = True
    assert anon.get("/api/v1/schema").status_code == 200
    assert anon.get("/api/v1/docs").status_code == 200
    assert anon.get("/api/v1/workflows").status_code == 401  # the API itself stays closed
