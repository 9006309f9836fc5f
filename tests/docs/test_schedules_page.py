"""docs/schedules.md's examples, run as written (so the page cannot rot): the
console session against the test database with real processes, and the
code declaration through the same sync that `migrate` runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import checked_by
from tests.support.procs import ROOT, process_env
from workflows.models import PilotSchedule, Task

PAGE = ROOT / "docs" / "schedules.md"




@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_console_session_creates_fires_lists_and_deletes_a_schedule():
    [session] = checked_by(
        PAGE, "test_the_console_session_creates_fires_lists_and_deletes_a_schedule")
    commands = [line[2:] for line in session.splitlines() if line.startswith("$ ")]
    assert len(commands) == 4 and commands[1].startswith("timeout -s INT 10 ")
    env = process_env(PILOT_LOG_STREAM="stderr", PILOT_LOG_LEVEL="warning")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    outputs = []
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
        # `timeout` exits 124 when it had to stop the command: the scheduler's way to end here.
        assert done.returncode in ((0, 124) if command.startswith("timeout") else (0,)), (
            command, done.stdout, done.stderr)
        outputs.append(done.stdout)
    assert outputs[0].startswith("created: schedule heartbeat triggers demo.echo")
    assert re.match(r"scheduler stopped after \d+ passes", outputs[1])
    fired = list(Task.objects.values_list("idempotency_key", "payload"))
    assert fired and all(key.startswith("schedule:heartbeat:") and payload == {"ping": True}
                         for key, payload in fired)
    assert len({key for key, _ in fired}) == len(fired)
    assert "heartbeat: demo.echo at '*/2 * * * * *', enabled, missed run_once" in outputs[2]
    assert f"({len(fired)} runs)" in outputs[2]
    assert outputs[3].startswith("deleted: schedule heartbeat")
    assert PilotSchedule.objects.count() == 0 and Task.objects.count() == len(fired)


@pytest.mark.django_db
def test_the_code_declaration_is_written_by_the_sync():
    from workflows.engine.schedule_definitions import schedules_sync_declared
    from workflows.registry import registry

    [code] = checked_by(PAGE, "test_the_code_declaration_is_written_by_the_sync")
    try:
        exec(compile(code, str(PAGE), "exec"), {})
        assert schedules_sync_declared().created == ["acme.nightly_report"]
    finally:
        registry.unregister("acme.nightly_report")
    schedule = PilotSchedule.objects.get()
    assert (schedule.workflow, schedule.cron, schedule.payload, schedule.missed,
            schedule.origin) == ("acme.nightly_report", "0 3 * * *", {"format": "pdf"},
                                 "run_once", "code")
