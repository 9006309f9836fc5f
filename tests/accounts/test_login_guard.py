"""Admin login brute-force protection on the real auth stack (admin login
view, signals, the shared cache): lockouts per (username, address), per
username, per address and per known device, that expire by themselves, never
lock a known browser out, and fail closed; the current-password check of
/admin/password_change/ limited the same way."""

import time
from io import StringIO

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client, override_settings

from workflows.accounts.login_guard import (
    DEVICE_COOKIE,
    client_ip,
    device_cookie_value,
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


# --- one account from many addresses; known devices; failing closed ---------------------------

def device_client(ip="10.0.0.1") -> Client:
    """A browser that logged in as op once (so it carries op's device cookie)."""
    client = Client(REMOTE_ADDR=ip)
    assert login(PASSWORD, client=client)
    client.post("/admin/logout/")
    assert client.cookies[DEVICE_COOKIE].value
    return client


@override_settings(PILOT_LOGIN_MAX_FAILURES_PER_USER=8)
def test_guessing_one_account_from_many_addresses_meets_the_per_user_bound(operator):
    for n in range(8):  # a botnet: two guesses from each of four addresses
        assert not login("wrong", ip=f"198.51.100.{n // 2}")
    assert not login(PASSWORD, ip="198.51.100.200")  # a fresh address is refused too
    assert login_lockout_remaining(username="op", ip="198.51.100.201") > 0


@override_settings(PILOT_LOGIN_MAX_FAILURES_PER_USER=8)
def test_no_lockout_an_attacker_causes_locks_out_a_browser_that_logged_in_before(operator):
    known = device_client(ip="10.0.0.1")
    # Everything an attacker can lock: the pair, the whole username, the address.
    for n in range(8):
        login("wrong", ip="10.0.0.1" if n < 5 else f"198.51.100.{n}")
    with override_settings(PILOT_LOGIN_MAX_FAILURES_PER_IP=1):
        login("wrong", ip="10.0.0.1", username="someone-else")
    stranger = Client(REMOTE_ADDR="10.0.0.1")
    assert not login(PASSWORD, client=stranger)
    assert "Too many failed logins" in stranger.post(
        "/admin/login/", {"username": "op", "password": PASSWORD}).content.decode()
    assert login(PASSWORD, client=known)  # same address, but a known device


def test_a_device_cookie_only_vouches_for_its_own_user_and_only_if_signed(operator,
                                                                         django_user_model):
    django_user_model.objects.create_user("other", password=PASSWORD, is_staff=True)
    known = device_client()
    for _ in range(5):
        login("wrong", username="other", ip="10.0.0.1")
    assert not login(PASSWORD, username="other", client=known)  # op's cookie, not other's
    forged = Client(REMOTE_ADDR="10.0.0.1")
    forged.cookies[DEVICE_COOKIE] = device_cookie_value("other") + "x"
    assert not login(PASSWORD, username="other", client=forged)


def test_guessing_with_a_known_device_locks_only_that_device(operator):
    known = device_client()
    for _ in range(5):
        assert not login("wrong", client=known)
    assert not login(PASSWORD, client=known)
    assert login(PASSWORD, ip="10.0.0.1")  # the address itself was never blamed


@override_settings(CACHES={"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                       "LOCATION": "redis://127.0.0.1:1/0",
                                       "OPTIONS": {"socket_connect_timeout": 0.2}}})
def test_logins_fail_closed_while_the_lockout_store_is_unreachable(operator):
    assert not login(PASSWORD)
    page = Client().post("/admin/login/", {"username": "op", "password": PASSWORD})
    assert "Logins are paused" in page.content.decode()


def test_an_operator_can_lift_a_per_user_lockout(operator, settings):
    settings.PILOT_LOGIN_MAX_FAILURES_PER_USER = 3
    for n in range(3):
        login("wrong", ip=f"198.51.100.{n}")
    assert not login(PASSWORD, ip="10.9.9.9")
    out = StringIO()
    call_command("login_unlock", "op", stdout=out)
    assert "lifted" in out.getvalue()
    assert login(PASSWORD, ip="10.9.9.9")


# --- the current password on /admin/password_change/ -----------------------------------------

NEW = "an entirely new passphrase 42"


def change_password(client, old):
    return client.post("/admin/password_change/", {"old_password": old, "new_password1": NEW,
                                                   "new_password2": NEW})


def test_the_current_password_check_is_limited_like_a_login(operator):
    session = Client()
    session.force_login(operator)
    for _ in range(5):
        assert change_password(session, "wrong").status_code == 200
    page = change_password(session, PASSWORD)
    assert page.status_code == 200 and "Too many wrong current passwords" in \
        page.content.decode()
    operator.refresh_from_db()
    assert operator.check_password(PASSWORD)  # unchanged
    assert login_lockout_remaining(username="op", ip="10.0.0.1") == 0  # logins unaffected


def test_a_right_current_password_changes_it_and_clears_the_count(operator):
    session = Client()
    session.force_login(operator)
    for _ in range(4):
        change_password(session, "wrong")
    assert change_password(session, PASSWORD).status_code == 302
    operator.refresh_from_db()
    assert operator.check_password(NEW)
