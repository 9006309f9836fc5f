"""The API inside a host project's settings (docs/embedding.md): nothing global
is required, the host's REST framework defaults do not leak in, URLs come from
where the project mounted the API, and a missing middleware degrades (with a
check warning), never crashes."""

import pytest
import yaml
from django.test import override_settings

from tests.api.conftest import assert_problem, trigger
from workflows.models import Task

pytestmark = pytest.mark.django_db

# A host's DRF defaults, each unlike PILOT's own choice.
HOSTILE_REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.BrowsableAPIRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.FormParser"],
    "DEFAULT_SCHEMA_CLASS": "rest_framework.schemas.openapi.AutoSchema",
    "DEFAULT_VERSIONING_CLASS": "rest_framework.versioning.NamespaceVersioning",
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.AnonRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"anon": "1/day"},
    "EXCEPTION_HANDLER": "rest_framework.views.exception_handler",
}


@override_settings(REST_FRAMEWORK=HOSTILE_REST_FRAMEWORK)
def test_the_api_keeps_its_own_choices_whatever_the_hosts_drf_defaults(api, anon):
    created = trigger(api, key="host-1")
    assert created.status_code == 202, created.content
    assert created["Content-Type"] == "application/json"
    assert_problem(trigger(api, key="host-2", workflow="no.such"), 400, "unknown_workflow")
    assert_problem(anon.get("/api/v1/tasks"), 401, "not_authenticated")
    assert_problem(api.post("/api/v1/tasks", "x" * 400_000, content_type="application/json"),
                   413, "payload_too_large")
    assert_problem(api.post("/api/v1/tasks", "{", content_type="application/json"),
                   400, "parse_error")
    schema = api.get("/api/v1/schema")
    assert schema.status_code == 200
    assert "/api/v1/tasks" in yaml.safe_load(schema.content)["paths"]
    assert anon.get("/healthz").status_code == 200  # no anonymous throttle of the host's


@override_settings(ROOT_URLCONF="tests.api.mounted_urls")
def test_location_and_schema_paths_follow_where_the_api_is_mounted(api):
    r = api.post(
        "/elsewhere/pilot/tasks", {"workflow": "demo.echo", "payload": {}}, format="json",
        HTTP_IDEMPOTENCY_KEY="mounted")
    assert r.status_code == 202, r.content
    assert r["Location"] == f"/elsewhere/pilot/tasks/{r.json()['id']}"
    assert api.get(r["Location"]).json()["id"] == r.json()["id"]
    paths = yaml.safe_load(api.get("/elsewhere/pilot/schema").content)["paths"]
    assert set(paths) == {
        "/elsewhere/pilot/tasks", "/elsewhere/pilot/tasks/batch",
        "/elsewhere/pilot/tasks/{task_id}", "/elsewhere/pilot/tasks/{task_id}/cancel",
        "/elsewhere/pilot/tasks/{task_id}/retry",
        "/elsewhere/pilot/tasks/{task_id}/signals/{name}", "/elsewhere/pilot/workflows",
        "/ops/healthz", "/ops/readyz"}
    assert paths["/elsewhere/pilot/tasks"]["post"]["requestBody"]["required"] is True


def test_a_trigger_without_the_trace_middleware_still_records_a_trace_id(api, settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE
                           if m != "workflows.observability.middleware.TraceIdMiddleware"]
    r = trigger(api, key="no-mw", HTTP_X_REQUEST_ID="req-from-client")
    assert r.status_code == 202, r.content
    assert Task.objects.get(pk=r.json()["id"]).trace_id == "req-from-client"
    plain = trigger(api, key="no-mw-2")
    assert len(Task.objects.get(pk=plain.json()["id"]).trace_id) == 32
