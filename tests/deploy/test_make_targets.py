"""`make test-main` and `make mutate-ci` cannot pass CI without running on
PostgreSQL: with PILOT_REQUIRE_POSTGRES=1 (set by .ci/run) a DATABASE_URL that is not
PostgreSQL is a failure; without it, a friendly note and success (a developer's
`make test` on SQLite)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_test_main(target: str = "test-main", **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "PILOT_REQUIRE_POSTGRES", "MAKEFLAGS", "MAKELEVEL")}
    env.update(env_vars)
    # -o: the prerequisites (virtualenv, chromium) count as made; only the recipe runs.
    return subprocess.run(
        ["make", "-s", "-C", str(ROOT),
         "-o", ".venv/.installed-dev", "-o", "chromium", target],
        env=env, capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize("target", ["test-main", "mutate-ci"])
@pytest.mark.parametrize("database_url", ["sqlite:///db.sqlite3", None])
def test_required_postgres_without_postgres_fails_loudly(database_url, target):
    env = {"PILOT_REQUIRE_POSTGRES": "1"}
    if database_url:
        env["DATABASE_URL"] = database_url
    result = run_test_main(target, **env)
    assert result.returncode != 0
    assert "PILOT_REQUIRE_POSTGRES=1 but DATABASE_URL is not PostgreSQL" in result.stderr
    assert "passed" not in result.stdout and "killed" not in result.stdout


def test_without_the_requirement_a_note_and_success():
    result = run_test_main(DATABASE_URL="sqlite:///db.sqlite3")
    assert result.returncode == 0, result.stderr
    assert "DATABASE_URL is not PostgreSQL: PostgreSQL/Redis tests not run" in result.stdout


def test_without_the_requirement_the_mutation_check_says_it_did_not_run():
    result = run_test_main("mutate-ci", DATABASE_URL="sqlite:///db.sqlite3")
    assert result.returncode == 0, result.stderr
    assert "the mutation check is not run" in result.stdout
