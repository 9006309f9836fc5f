"""The console's small things (issue 32, C10): "View site" opens the
console's index, an unfiltered list offers no "(Show all)", a single-task
confirmation offers no button when the task would not change and names the
deed on the one it offers, and django-q's own records are named apart from
PILOT's on the index."""

from __future__ import annotations

import pytest

from tests.admin.conftest import task_url
from tests.factories import make_task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

SHOW_ALL = ">Show all</a>)"


def test_an_unfiltered_list_offers_no_show_all_a_searched_one_does(operator_client, owner):
    make_task(owner, key="alpha-1")
    make_task(owner, key="beta-1")
    assert SHOW_ALL not in operator_client.get("/admin/workflows/task/").content.decode()
    searched = operator_client.get("/admin/workflows/task/", {"q": "alpha"}).content.decode()
    assert SHOW_ALL in searched and "1 result" in searched
    filtered = operator_client.get("/admin/workflows/task/", {"state__exact": "pending"})
    assert filtered.status_code == 200


def test_a_confirmation_of_a_task_that_would_not_change_offers_no_button(operator_client,
                                                                        owner):
    done = make_task(owner, state=S.SUCCEEDED)
    html = operator_client.get(task_url(done, "transition/cancel/")).content.decode()
    assert 'class="pilot-no-change"' in html
    assert 'id="pilot-confirm"' not in html and 'id="pilot-nothing-to-do"' in html
    assert 'id="pilot-back"' in html
    pending = make_task(owner)
    html = operator_client.get(task_url(pending, "transition/cancel/")).content.decode()
    assert 'id="pilot-confirm" value="Cancel this task"' in html
    assert ": confirm\"" not in html


def test_the_index_names_django_qs_records_apart_from_pilots(admin_client):
    html = admin_client.get("/admin/").content.decode()
    assert "Django Q internals (the queue library&#x27;s own records, not PILOT&#x27;s tasks)" \
        in html
    assert 'href="/admin/workflows/webhookdelivery/"' in html
    assert 'href="/admin/workflows/pilotschedule/"' in html
