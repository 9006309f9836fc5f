"""docs/embedding.md's in-process trigger, run as written: the run is created
once, replayed on the same key, sent to the queue only on commit, and a refusal
raises with its code."""

from __future__ import annotations

import pytest

from tests.docs.blocks import checked_by
from tests.support.procs import ROOT
from workflows.models import Task

PAGE = ROOT / "docs" / "embedding.md"




@pytest.mark.django_db
def test_triggering_from_your_code_creates_once_replays_and_refuses(
        capsys, django_capture_on_commit_callbacks):
    [code] = checked_by(PAGE, "test_triggering_from_your_code_creates_once_replays_and_refuses")
    with django_capture_on_commit_callbacks(execute=False) as sent:
        exec(compile(code, str(PAGE), "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["created replayed True",
                                                    "refused: validation_error"]
    [task] = Task.objects.filter(idempotency_key="order-42")
    assert (task.workflow, task.payload, task.owner.get_username()) == \
        ("demo.echo", {"order": 42}, "shop-backend")
    assert sent  # the message (and the events) wait for the commit


def test_the_logging_block_prints_pilots_events_as_json_lines():
    """The page's LOGGING, configured in a fresh process (dictConfig is
    process-wide): an event of PILOT's comes out as one JSON line."""
    import json
    import os
    import subprocess
    import sys

    [code] = checked_by(PAGE, "test_the_logging_block_prints_pilots_events_as_json_lines")
    # After django.setup(), which applies the suite's own LOGGING first.
    script = ("import django\ndjango.setup()\n" + code +
              "\nimport logging.config\nlogging.config.dictConfig(LOGGING)\n"
              "from workflows.observability.events import emit\n"
              "emit('task_triggered', task_id='t-1', workflow='shop.receipt')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"})
    assert done.returncode == 0, done.stderr
    [line] = [json.loads(x) for x in done.stderr.splitlines() if x.startswith("{")]
    assert (line["event"], line["workflow"], line["task_id"]) == \
        ("task_triggered", "shop.receipt", "t-1")
