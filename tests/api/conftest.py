import pytest
from rest_framework.test import APIClient

from workflows.accounts import api_client_create


def client_for(name: str):
    user, token = api_client_create(name)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    client.user = user
    return client


@pytest.fixture
def api(db):
    """An upstream client (`client-a`) with a token and the trigger permission."""
    return client_for("client-a")


@pytest.fixture
def api_b(db):
    return client_for("client-b")


@pytest.fixture
def anon():
    return APIClient()


def trigger(client, key="k-1", workflow="demo.echo", payload=None, **extra):
    body = {"workflow": workflow, "payload": {"msg": "hi"} if payload is None else payload}
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return client.post("/api/v1/tasks", body, format="json", **headers, **extra)


def assert_problem(response, status: int, code: str):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json", response["Content-Type"]
    body = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    assert body["type"].endswith(code) and body["title"] and body["detail"]
    assert "Traceback" not in response.content.decode()
    return body
