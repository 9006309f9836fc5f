"""What the doc tests share: a developer's environment, and `make run`'s database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.local.conftest import _TEST_ONLY
from tests.support.procs import ROOT

VENV_BIN = str(Path(sys.executable).parent)


def developer_env(*, venv: bool = False) -> dict[str, str]:
    """A developer's new terminal in the project directory: none of the suite's
    variables, and `python` the system's unless their virtualenv is active."""
    env = {k: v for k, v in os.environ.items()
           if k not in _TEST_ONLY and k not in ("DJANGO_DEBUG", "PILOT_DEMO_WORKFLOWS",
                                                "VIRTUAL_ENV")}
    path = [p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if p and Path(p).resolve() != Path(VENV_BIN).resolve()]
    env["PATH"] = os.pathsep.join([VENV_BIN, *path] if venv else path)
    return env



@pytest.fixture(scope="session")
def make_run_database(tmp_path_factory) -> str:
    """A migrated SQLite file, as `make run` leaves db.sqlite3 (made on first use,
    once per session: migrating takes seconds)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('make-run') / 'db.sqlite3'}"
    done = subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT,
                          env={**developer_env(), "DATABASE_URL": url},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return url
