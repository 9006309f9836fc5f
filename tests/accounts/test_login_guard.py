"""Admin login brute-force protection: lockouts per (username, address) that
expire by themselves, on the real auth stack (admin login view, signals,
database cache)."""

import time

import pytest
from django.core.cache import cache
from django.test import Client, override_settings

from workflows.login_guard import (
    client_ip,
    login_failure_record,
    login_lockout_remaining,
)

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _clean_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("op", password=PASSWORD, is_staff=True,
                                                 is_superuser=True)


def login(password, *, ip="10.0.0.1", username="op", client=None):
    client = client or Client(REMOTE_ADDR=ip)
    client.post("/admin/login/", {"username": username, "password": password,
                                  "next": "/admin/"})
    return client.session.get("_auth_user_id") is not None


def test_five_failures_lock_the_pair_out_even_with_the_right_password(operator, settings):
    assert settings.PILOT_LOGIN_MAX_FAILURES == 5
    for _ in range(4):
        assert not login("wrong")
    assert login_lockout_remaining(username="op", ip="10.0.0.1") == 0
    assert not login("wrong")
    remaining = login_lockout_remaining(username="op", ip="10.0.0.1")
    assert 890 < remaining <= 900
    assert not login(PASSWORD)
    # The same user from another address is not locked out.
    assert login(PASSWORD, ip="10.0.0.2")


def test_the_lockout_expires_by_itself(operator, settings):
    locked_at = time.time() - settings.PILOT_LOGIN_LOCKOUT_SECONDS - 1
    for _ in range(5):
        login_failure_record(username="op", ip="10.0.0.1", now=locked_at)
    assert login_lockout_remaining(username="op", ip="10.0.0.1", now=locked_at + 1) > 0
    assert login_lockout_remaining(username="op", ip="10.0.0.1") == 0
    assert login(PASSWORD)


def test_failures_spread_over_more_than_the_window_do_not_add_up():
    start = 1_000_000.0
    for i in range(4):
        login_failure_record(username="op", ip="a", now=start + i)
    later = start + 901
    assert login_failure_record(username="op", ip="a", now=later) == 0  # a fresh window
    assert login_lockout_remaining(username="op", ip="a", now=later) == 0


def test_a_success_clears_the_count(operator):
    for _ in range(4):
        login("wrong")
    assert login(PASSWORD)
    for _ in range(4):
        assert not login("wrong")
    assert login_lockout_remaining(username="op", ip="10.0.0.1") == 0


def test_usernames_are_compared_case_insensitively_for_the_lock():
    for _ in range(5):
        login_failure_record(username="Op", ip="a")
    assert login_lockout_remaining(username="oP ", ip="a") > 0


def test_failures_while_locked_do_not_extend_the_lockout():
    now = 2_000_000.0
    for _ in range(5):
        login_failure_record(username="op", ip="a", now=now)
    assert login_failure_record(username="op", ip="a", now=now + 800) == 0
    assert login_lockout_remaining(username="op", ip="a", now=now + 901) == 0


@override_settings(PILOT_LOGIN_MAX_FAILURES_PER_IP=6)
def test_an_address_spraying_many_usernames_is_locked_out_for_all(operator):
    for n in range(6):
        login("wrong", username=f"guess{n}")
    assert not login(PASSWORD)  # "op" itself never failed, but the address did


class _Request:
    def __init__(self, remote, forwarded=None):
        self.META = {"REMOTE_ADDR": remote}
        if forwarded:
            self.META["HTTP_X_FORWARDED_FOR"] = forwarded


def test_the_client_address_comes_from_the_trusted_proxy_hop(settings):
    settings.PILOT_TRUSTED_PROXIES = 0
    assert client_ip(_Request("10.1.1.1", "6.6.6.6")) == "10.1.1.1"  # header not trusted
    settings.PILOT_TRUSTED_PROXIES = 1
    # The client forged a first entry; the proxy appended the real address.
    assert client_ip(_Request("10.1.1.1", "6.6.6.6, 203.0.113.9")) == "203.0.113.9"
    settings.PILOT_TRUSTED_PROXIES = 2
    assert client_ip(_Request("10.1.1.1", "6.6.6.6, 203.0.113.9, 10.2.2.2")) == "203.0.113.9"
    assert client_ip(_Request("10.1.1.1")) == "10.1.1.1"
