"""What the doc tests share: a developer's environment, and `make run`'s database."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.local.conftest import _TEST_ONLY, LocalRun, local_run_start, local_run_stop

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
def make_run_server(tmp_path_factory) -> Iterator[LocalRun]:
    """One real `make run` (bin/run-local: web server, workers, dispatcher on its own
    SQLite file and a free port) for the whole session, started on first use: the
    doc blocks that need a server, or make run's database, share it."""
    runs: list[LocalRun] = []
    try:
        yield local_run_start(tmp_path_factory.mktemp("make-run"), runs)
    finally:
        local_run_stop(runs)


@pytest.fixture(scope="session")
def make_run_database(make_run_server) -> str:
    """make run's database, as `manage.py` in its checkout finds it."""
    return f"sqlite:///{make_run_server.database}"
