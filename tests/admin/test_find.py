"""Finding tasks in the list (workflows/admin/search.py, docs/console.md
"Finding tasks"): a payload field, the last error's text, time ranges on
created and finished, a link to the view — and the malformed ones refused
with a message, never a 500. Runs on SQLite (JSON key lookups) and on
PostgreSQL (a containment served by the GIN index: tests/admin/test_plans.py
checks its plan)."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.messages import get_messages
from django.utils import timezone

from tests.admin.conftest import LIST_URL
from tests.factories import make_task
from workflows.admin.search import payload_term, search_problem
from workflows.models import Task

pytestmark = pytest.mark.django_db


def shown(response) -> set[str]:
    """The idempotency keys of the rows on a list page."""
    assert response.status_code == 200, response.status_code
    return set(re.findall(r'<td class="field-key_short"><span title="([^"]+)"',
                          response.content.decode()))


def test_a_payload_field_finds_its_tasks_by_value_and_path(operator_client, owner):
    make_task(owner, key="order-42", payload={"order_id": 42, "shop": {"id": "acme-17"}})
    make_task(owner, key="order-42-text", payload={"order_id": "42"})
    make_task(owner, key="order-420", payload={"order_id": 420, "shop": {"id": "acme-1"}})
    make_task(owner, key="no-order", payload={"note": "order_id=42"})
    get = lambda q: shown(operator_client.get(LIST_URL, {"q": q}))  # noqa: E731
    assert get("payload.order_id=42") == {"order-42", "order-42-text"}
    assert get('payload.order_id="42"') == {"order-42-text"}  # quoted: the text only
    assert get("payload.shop.id=acme-17") == {"order-42"}
    assert get("payload.shop.id=acme") == set()  # equality, not a substring
    assert get("payload.missing=1") == set()
    # The old searches still work beside it.
    assert get("order-42") == {"order-42", "order-42-text", "order-420"}


def test_the_last_errors_text_is_searched_with_error_prefix(operator_client, owner):
    failed = make_task(owner, key="failed-merchant", state="failed")
    Task.objects.filter(pk=failed.pk).update(error="RetryableError: Merchant API said 502")
    make_task(owner, key="failed-other", state="failed")
    assert shown(operator_client.get(LIST_URL, {"q": "error:merchant"})) == {"failed-merchant"}
    both = operator_client.get(LIST_URL, {"q": "error:merchant", "state__exact": "failed"})
    assert shown(both) == {"failed-merchant"}


def test_created_and_finished_ranges_filter_the_list(operator_client, owner):
    now = timezone.now()
    old = make_task(owner, key="finished-long-ago", state="succeeded")
    Task.objects.filter(pk=old.pk).update(finished_at=now - timedelta(hours=3),
                                          created_at=now - timedelta(hours=3))
    make_task(owner, key="finished-just-now", state="succeeded")
    make_task(owner, key="still-pending")
    since = (now - timedelta(hours=1)).isoformat()
    assert shown(operator_client.get(LIST_URL, {"finished_at__gte": since})) == {
        "finished-just-now"}
    assert shown(operator_client.get(LIST_URL, {"finished_at__lt": since})) == {
        "finished-long-ago"}
    assert shown(operator_client.get(LIST_URL, {"created_at__gte": since})) == {
        "finished-just-now", "still-pending"}
    # The range form sends its empty boxes too: they are no bound, and the
    # link to the view carries only the bounds set.
    response = operator_client.get(LIST_URL, {"created_at__gte": since, "created_at__lt": "",
                                              "finished_at__gte": "", "finished_at__lt": ""})
    assert shown(response) == {"finished-just-now", "still-pending"}
    assert not list(get_messages(response.wsgi_request))
    link = re.search(r'id="pilot-view-link" href="([^"]+)"', response.content.decode()).group(1)
    assert parse_qs(urlsplit(link.replace("&amp;", "&")).query) == {"created_at__gte": [since]}


@pytest.mark.parametrize("params, says", [
    ({"finished_at__gte": "yesterday"}, "finished_at__gte must be an ISO 8601 date"),
    ({"created_at__lt": "2026-13-45"}, "created_at__lt"),
    ({"finished_at__lt": "2026-01-01T00:00+23:00"}, "beyond ±15:59"),
    ({"q": "payload.order_id"}, "needs a key path and a value"),
    ({"q": "payload.=4"}, "needs a key path and a value"),
    ({"q": 'payload.a={"b": 1}'}, "not an object or list"),
    ({"q": "payload." + ".".join("k" * 9) + "=1"}, "deeper than 8"),
    ({"q": "error:  "}, "needs the text to look for"),
])
def test_a_malformed_search_or_range_is_refused_with_a_message(operator_client, owner,
                                                               params, says):
    make_task(owner, key="present")
    response = operator_client.get(LIST_URL, {**params, "state__exact": "pending"}, follow=True)
    assert response.status_code == 200
    text = " ".join(str(m) for m in get_messages(response.wsgi_request))
    assert "Filter ignored" in text and says in text, text
    assert response.redirect_chain[-1][0] == f"{LIST_URL}?state__exact=pending"


@pytest.mark.parametrize("value", ["1e999", "NaN", "-Infinity", "9" * 30, "\u00e9t\u00e9",
                                   "[1", "true", "null"])
def test_odd_payload_values_search_without_error(operator_client, owner, value):
    make_task(owner, key="odd", payload={"v": value})
    found = shown(operator_client.get(LIST_URL, {"q": f"payload.v={value}"}))
    assert found == {"odd"}  # the text as typed matches the text stored


def test_null_finds_a_json_null(operator_client, owner):
    make_task(owner, key="nulled", payload={"v": None})
    make_task(owner, key="absent", payload={})
    assert shown(operator_client.get(LIST_URL, {"q": "payload.v=null"})) == {"nulled"}


def test_the_payload_term_is_read_as_json_then_as_text():
    assert payload_term("payload.a.b=42").values == (42, "42")
    assert payload_term("payload.a=x y").values == ("x y",)
    assert payload_term("payload.a=null").values == (None, "null")
    assert payload_term("payload.a=1e999").values == ("1e999",)
    assert payload_term("order-1") is None
    assert search_problem("x" * 256) == "is longer than 255 characters"


def test_the_list_links_to_its_view_and_offers_presets(operator_client, owner):
    make_task(owner, key="present")
    html = operator_client.get(LIST_URL, {"q": "payload.n=1", "state__exact": "pending",
                                          "before": "2999-01-01T00:00:00+00:00,"
                                                    "00000000-0000-0000-0000-000000000000"}
                               ).content.decode()
    link = re.search(r'id="pilot-view-link" href="([^"]+)"', html).group(1)
    assert link.startswith("http://testserver/admin/workflows/task/?")
    query = parse_qs(urlsplit(link.replace("&amp;", "&")).query)
    assert query == {"q": ["payload.n=1"], "state__exact": ["pending"]}  # no list position
    presets = re.findall(r'href="\?([^"]+)" data-range-preset="created_at-1"', html)
    preset = parse_qs(presets[0].replace("&amp;", "&"))
    assert preset["q"] == ["payload.n=1"] and preset["state__exact"] == ["pending"]
    start = timezone.datetime.fromisoformat(preset["created_at__gte"][0])
    assert timedelta(minutes=14) < timezone.now() - start < timedelta(minutes=16)
    assert "last hour" in html and 'data-range-preset="finished_at-4"' in html
    assert shown(operator_client.get(LIST_URL + "?" + presets[0].replace("&amp;", "&"))) == {
        "present"}


def test_keyset_pages_walk_a_payload_search(operator_client, owner):
    now = timezone.now()
    for i in range(53):
        task = make_task(owner, key=f"batch-{i:02}", payload={"batch": 7, "i": i})
        Task.objects.filter(pk=task.pk).update(created_at=now - timedelta(seconds=i))
    make_task(owner, key="other-batch", payload={"batch": 8})
    first = operator_client.get(LIST_URL, {"q": "payload.batch=7"})
    keys = shown(first)
    assert len(keys) == 50 and "other-batch" not in keys
    older = re.search(r'href="([^"]+)" class="pilot-page-older"', first.content.decode())
    rest = shown(operator_client.get(LIST_URL + older.group(1).replace("&amp;", "&")))
    assert rest == {"batch-50", "batch-51", "batch-52"}
