"""docs/client.md's examples, run as written (so the page cannot rot): the quick
start against a live PILOT, the webhook recipe on its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import checked_by
from tests.support.procs import ROOT

PAGE = Path(__file__).resolve().parents[2] / "docs" / "client.md"


def python_blocks() -> list[str]:
    """The quick start and the webhook recipe, as their markers name these tests."""
    return [*checked_by(PAGE, "test_the_quick_start_runs_against_a_live_pilot"),
            *checked_by(PAGE, "test_the_webhook_recipe_runs")]


def run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", **env})


def test_the_page_has_the_two_examples():
    blocks = python_blocks()
    assert len(blocks) == 2
    assert "PilotClient(os.environ" in blocks[0] and "verify_webhook" in blocks[1]


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_quick_start_runs_against_a_live_pilot(live_pilot, api_client):
    _, url = live_pilot
    done = run(python_blocks()[0], PILOT_URL=url, PILOT_TOKEN=api_client[1])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"created [0-9a-f-]{36}", lines[0])
    assert lines[1:] == ["succeeded {'echo': {'order': 42}}", "replayed: True True",
                         "refused: idempotency_key_reused 422"]


def test_the_webhook_recipe_runs():
    done = run(python_blocks()[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "task 5b0d8c1e succeeded delivery 5b0d8c1e:succeeded:0\n"
