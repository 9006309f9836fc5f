"""No console list is an oracle (issue 31, N1): a staff user who may only view
tried `?secret__regex=` / `?secret__startswith=` on the client webhooks list and
read another client's signing secret off the row count, one character at a
time (309 requests). Here the same attack, as that user, on every list of the
admin site: every field of every model with `__regex`, `__startswith` and
`__gt`, and search and ordering — none may filter by what it was given.
"""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from tests.factories import make_task
from workflows.accounts import api_client_create, client_webhook_ensure
from workflows.admin.guard import SENSITIVE_FIELDS, lookup_is_sensitive
from workflows.models import ClientWebhook

pytestmark = pytest.mark.django_db

LOOKUPS = ("regex", "startswith", "gt")


@pytest.fixture
def viewonly(django_user_model):
    """Staff with every view permission of every model, and nothing else."""
    user = django_user_model.objects.create_user("viewonly", password="pw-viewonly",
                                                 is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def victim():
    user, _ = api_client_create("beta")
    _, secret = client_webhook_ensure(user, url="")
    make_task(owner=user, key="k-beta")
    return secret


def _lists():
    for model in admin.site._registry:
        opts = model._meta
        yield model, reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")


def _dropped(response, name: str) -> bool:
    """The list refused the parameter: a redirect without it, or a 400."""
    if response.status_code == 400:
        return True
    return response.status_code == 302 and name not in response["Location"]


def test_no_lookup_on_any_field_of_any_list_reaches_the_database(viewonly, victim):
    tried = 0
    for model, url in _lists():
        for field in model._meta.concrete_fields:
            for lookup in LOOKUPS:
                name = f"{field.name}__{lookup}"
                value = "^w" if lookup == "regex" else "w"
                response = viewonly.get(url, {name: value})
                assert _dropped(response, name), (url, name, response.status_code)
                tried += 1
    assert tried > 200  # every list of the site was reached


def test_the_reported_attack_learns_nothing_about_the_secret(viewonly, victim):
    url = reverse("admin:workflows_clientwebhook_changelist")
    assert viewonly.get(url).status_code == 200  # the user does see the list
    stored = ClientWebhook.objects.get().secret
    answers = set()
    for guess in (victim[:7], "whsec_" + chr(ord(victim[6]) ^ 1), stored[:4], "zz"):
        for name, value in (("secret__startswith", guess), ("secret__regex", re.escape(guess)),
                            ("secret", guess)):
            response = viewonly.get(url, {name: value})
            answers.add((response.status_code, response.get("Location")))
        searched = viewonly.get(url, {"q": guess})  # search is allowed: not on the secret
        answers.add((searched.status_code, searched.context["cl"].result_count))
    assert answers == {(302, url), (200, 0)}  # the same answers, whatever the guess


def test_a_sensitive_lookup_is_refused_even_when_a_filter_would_produce_it(rf):
    from workflows.admin.webhooks import ClientWebhookAdmin

    model_admin = ClientWebhookAdmin(ClientWebhook, admin.site)
    assert lookup_is_sensitive("owner__pilot_webhook__secret__regex")
    assert not model_admin.lookup_allowed("secret__startswith", "w", rf.get("/"))
    assert not model_admin.lookup_allowed("owner__password__startswith", "p", rf.get("/"))


def test_no_list_searches_sorts_or_shows_a_sensitive_field(rf):
    request = rf.get("/")
    request.user = None
    for model, model_admin in admin.site._registry.items():
        named = [*model_admin.search_fields, *(f for f in model_admin.list_display
                                              if isinstance(f, str)),
                 *(f if isinstance(f, str) else getattr(f, "parameter_name", "")
                   for f in model_admin.list_filter if not isinstance(f, (tuple, list))),
                 *(model_admin.ordering or ())]
        leaks = [n for n in named if lookup_is_sensitive(n.lstrip("-^=@"))]
        assert not leaks, (model, leaks)
    assert {"secret", "digest", "password"} <= SENSITIVE_FIELDS


def test_the_lists_own_controls_still_work(viewonly, victim):
    schedules = reverse("admin:workflows_pilotschedule_changelist")
    assert viewonly.get(schedules, {"enabled__exact": "1", "q": "x", "o": "1"}).status_code == 200
    webhooks = reverse("admin:workflows_clientwebhook_changelist")
    response = viewonly.get(webhooks, {"q": "beta"})
    assert response.status_code == 200 and response.context["cl"].result_count == 1
    users = reverse("admin:auth_user_changelist")
    assert viewonly.get(users, {"is_staff__exact": "1"}).status_code == 200
