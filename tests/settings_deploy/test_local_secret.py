"""A local (DEBUG) run without DJANGO_SECRET_KEY gets a random secret generated
once per checkout into an ignored file, never a constant published with the
code: sessions, password-reset links and device cookies signed with a public
key could be forged by anyone."""

import stat
import subprocess
import sys
from pathlib import Path

from tests.settings_deploy.test_check_deploy import effective, production_env
from tests.support.procs import ROOT

OLD_PUBLIC_CONSTANT = "django-insecure-local-development-key-do-not-use-in-production"


def secret_key(path: Path) -> str:
    return effective("SECRET_KEY", DJANGO_DEBUG="true", DJANGO_SECRET_KEY="",
                     PILOT_LOCAL_SECRET_FILE=str(path))["SECRET_KEY"]


def test_the_local_secret_is_random_per_checkout_stable_and_private(tmp_path):
    first = secret_key(tmp_path / "a")
    assert first != OLD_PUBLIC_CONSTANT and len(first) >= 50
    assert secret_key(tmp_path / "a") == first  # read back, not regenerated
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o600
    assert secret_key(tmp_path / "b") != first  # another checkout, another key
    assert sorted(tmp_path.iterdir()) == [tmp_path / "a", tmp_path / "b"]  # no temp files left


def test_the_default_secret_file_is_ignored_by_git():
    ignored = subprocess.run(["git", "check-ignore", "-q", ".local-secret-key"], cwd=ROOT)
    assert ignored.returncode == 0


def test_an_unusable_secret_file_stops_the_start_with_a_clear_message(tmp_path):
    (tmp_path / "short").write_text("too-short\n")
    env = production_env(DJANGO_DEBUG="true", DJANGO_SECRET_KEY="",
                         PILOT_LOCAL_SECRET_FILE=str(tmp_path / "short"))
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "empty or truncated" in done.stderr
