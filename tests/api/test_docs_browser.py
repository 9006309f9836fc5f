"""GET /api/v1/docs renders offline: in a real browser that may reach nothing
but the server under test, Swagger UI draws every operation of the schema."""

from urllib.parse import urlsplit

import pytest

from tests.support.procs import ARTIFACTS

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


PASSWORD = "docs-reader-password-1"


def test_the_docs_render_with_nothing_but_the_server(live_server, page, django_user_model):
    django_user_model.objects.create_user("reader", password=PASSWORD, is_staff=True)
    server = urlsplit(live_server.url).netloc
    elsewhere = []

    def only_the_server(route):
        if urlsplit(route.request.url).netloc == server:
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_server)
    page.goto(f"{live_server.url}/api/v1/docs")
    assert urlsplit(page.url).path == "/admin/login/"  # not without a session
    page.fill("#id_username", "reader")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    assert urlsplit(page.url).path == "/api/v1/docs"  # and back
    page.wait_for_selector(".opblock", timeout=20_000)
    operations = page.locator(".opblock").count()
    page.screenshot(path=str(ARTIFACTS / "api-docs.png"), full_page=True)
    assert elsewhere == []
    assert operations >= 8  # every /api/v1 operation plus /healthz and /readyz
    assert page.locator("text=Idempotency").count() > 0
