"""docs/client.md's webhook recipe, run as written on its own (so the page cannot
rot); its quick start runs against make run in tests/docs/test_blocks.py (its
`pilot:run server` marker says what it must print)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.docs.blocks import checked_by
from tests.support.procs import ROOT

PAGE = Path(__file__).resolve().parents[2] / "docs" / "client.md"


def run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", **env})


def test_the_webhook_recipe_runs():
    [code] = checked_by(PAGE, "test_the_webhook_recipe_runs")
    done = run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "task 5b0d8c1e succeeded delivery 5b0d8c1e:succeeded:0\n"
