"""The login guard behind a real server, in the two ways PILOT_TRUSTED_PROXIES
can be wrong (docs/security.md):

- `1` while clients reach gunicorn directly: an attacker forges
  X-Forwarded-For and gets a new "address" per attempt. The per-username bound
  stops the guessing anyway.
- `0` behind a proxy: every client shares the proxy's address, so five bad
  passwords lock that address out for the user. The operator's own browser,
  which logged in before, is not locked out.

And the current password on /admin/password_change/ has an attempt limit.
"""

import contextlib
import re
import uuid

import pytest
import requests
from django.contrib.auth import get_user_model

from tests.support.procs import Fleet

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"


@contextlib.contextmanager
def web(**env):
    # Plain HTTP to 127.0.0.1: cookies without the Secure flag, or a client
    # other than a browser would not send them back.
    fleet = Fleet(PILOT_TEST_CACHE_PREFIX=f"login-{uuid.uuid4().hex[:8]}",
                  DJANGO_SECURE_COOKIES="false", **env)
    try:
        _, url = fleet.web(workers=2)
        yield url
    finally:
        fleet.stop_all()


@pytest.fixture
def operator(transactional_db):
    return get_user_model().objects.create_user("admin", password=PASSWORD, is_staff=True,
                                                is_superuser=True)


def csrf_of(session, url) -> str:
    page = session.get(url, timeout=10)
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)


def login(url, password, *, session=None, forwarded=None) -> tuple[bool, str]:
    """One admin login over HTTP; (logged in?, page text)."""
    session = session or requests.Session()
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    token = csrf_of(session, f"{url}/admin/login/")
    answer = session.post(f"{url}/admin/login/", data={
        "csrfmiddlewaretoken": token, "username": "admin", "password": password,
        "next": "/admin/"}, headers=headers, allow_redirects=False, timeout=10)
    return answer.status_code == 302, answer.text


def known_browser(url) -> requests.Session:
    """The operator's browser: it logged in once before the attack, then out."""
    browser = requests.Session()
    assert login(url, PASSWORD, session=browser)[0]
    browser.post(f"{url}/admin/logout/",
                 data={"csrfmiddlewaretoken": browser.cookies["csrftoken"]}, timeout=10)
    return browser


def test_forged_forwarded_addresses_meet_the_per_user_bound(operator):
    with web(PILOT_TRUSTED_PROXIES="1", PILOT_LOGIN_MAX_FAILURES_PER_USER="8") as url:
        browser = known_browser(url)
        for n in range(8):
            assert not login(url, "wrong", forwarded=f"203.0.113.{n}")[0]
        ok, page = login(url, PASSWORD, forwarded="203.0.113.99")  # a fresh forgery
        assert not ok and "Too many failed logins" in page
        assert login(url, PASSWORD, session=browser, forwarded="203.0.113.100")[0]


def test_behind_a_proxy_with_the_wrong_setting_the_operator_is_not_locked_out(operator):
    """PILOT_TRUSTED_PROXIES=0 behind a proxy: every request comes from the
    proxy's address (here 127.0.0.1)."""
    with web(PILOT_TRUSTED_PROXIES="0") as url:
        browser = known_browser(url)
        for _ in range(5):
            assert not login(url, "wrong", forwarded="198.51.100.7")[0]
        assert login(url, PASSWORD, session=browser)[0]  # the operator: in
        ok, page = login(url, PASSWORD)
        assert not ok and "Too many failed logins" in page  # everyone else: locked


def test_the_current_password_has_an_attempt_limit(operator):
    with web() as url:
        session = requests.Session()
        assert login(url, PASSWORD, session=session)[0]
        change = f"{url}/admin/password_change/"

        def attempt(old):
            return session.post(change, data={
                "csrfmiddlewaretoken": csrf_of(session, change), "old_password": old,
                "new_password1": "a brand new passphrase 7", "new_password2":
                "a brand new passphrase 7"}, allow_redirects=False, timeout=10)

        assert [attempt(f"guess-{n}").status_code for n in range(5)] == [200] * 5
        refused = attempt(PASSWORD)
        assert refused.status_code == 200 and "Too many wrong current passwords" in refused.text
        operator.refresh_from_db()
        assert operator.check_password(PASSWORD)
