"""`make run`'s credentials survive a restart (pilot_local_setup keeps them,
0600, next to the SQLite database) and `manage.py local_credentials` prints
them again; both refuse to run outside a local (DEBUG) run."""

import re
import stat
import subprocess
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from workflows import localcreds
from workflows.accounts import local_credentials_valid
from workflows.localcreds import credentials_path, credentials_read

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def local(settings, tmp_path, monkeypatch):
    """A local run whose database lives in tmp_path (the suite's may be a
    SQLite file whose neighbours are not ours)."""
    settings.DEBUG = True
    path = tmp_path / "db.sqlite3-credentials"
    monkeypatch.setattr(localcreds, "credentials_path", lambda: path)
    return path


def setup(*args) -> str:
    out = StringIO()
    call_command("pilot_local_setup", "--port", "8123", *args, stdout=out, no_color=True)
    return out.getvalue()


def shown(text: str) -> tuple[str, str]:
    return (re.search(r"user admin  password (\S+)", text).group(1),
            re.search(r"API token: (\S+)  \(client local-client\)", text).group(1))


def test_a_restart_keeps_the_password_and_token_and_the_command_prints_them(local):
    first = setup()
    password, token = shown(first)
    path = local
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert credentials_read(path) == {"user": "admin", "password": password, "token": token,
                                      "client": "local-client"}
    assert "Kept in " in first and "`make credentials` prints them again." in first

    again = setup()  # the next `make run`
    assert shown(again) == (password, token)
    assert local_credentials_valid(password, token)

    out = StringIO()
    call_command("local_credentials", "--port", "8123", stdout=out)
    assert shown(out.getvalue()) == (password, token)
    assert "http://127.0.0.1:8123/admin/" in out.getvalue()

    fresh = setup("--fresh")
    assert shown(fresh)[0] != password and shown(fresh)[1] != token
    assert not local_credentials_valid(password, token)


def test_credentials_that_no_longer_work_are_replaced_and_the_mode_restored(local):
    password, _ = shown(setup())
    path = local
    path.chmod(0o644)
    path.write_text(path.read_text().replace(password, "changed-in-the-console"))
    new_password, new_token = shown(setup())
    assert new_password != "changed-in-the-console"
    assert local_credentials_valid(new_password, new_token)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("not json")
    assert local_credentials_valid(*shown(setup()))


def test_they_live_beside_the_sqlite_database_in_a_git_ignored_file(settings, tmp_path):
    engine = settings.DATABASES["default"]["ENGINE"]
    if engine == "django.db.backends.sqlite3":
        assert credentials_path() == Path(f"{settings.DATABASES['default']['NAME']}-credentials")
    else:
        assert credentials_path() == Path(settings.BASE_DIR) / ".local-credentials"
    for name in ("db.sqlite3-credentials", ".local-credentials"):  # make run's, in the checkout
        assert subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT).returncode == 0


def test_outside_a_local_run_both_refuse_and_print_nothing(settings, local):
    settings.DEBUG = False
    for command in ("pilot_local_setup", "local_credentials"):
        out = StringIO()
        with pytest.raises(CommandError, match="DJANGO_DEBUG=true"):
            call_command(command, stdout=out)
        assert out.getvalue() == ""
    assert not local.exists()


def test_without_a_first_run_the_command_says_so(local):
    with pytest.raises(CommandError, match="make run` makes them on its first start"):
        call_command("local_credentials", stdout=StringIO())
