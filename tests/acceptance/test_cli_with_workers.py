"""`trigger_workflow --wait` against real worker processes: its exit status
reflects how the task ended."""

import json
import subprocess
import sys

import pytest

from tests.support.procs import ROOT, Fleet

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fleet():
    fleet = Fleet()
    fleet.workers()
    fleet.dispatcher()
    yield fleet
    fleet.stop_all()


def cli(fleet, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "trigger_workflow", *args], cwd=ROOT,
                          env={**fleet.env, "PILOT_LOG_STREAM": "stderr"}, capture_output=True,
                          text=True, timeout=90)


def test_wait_exits_0_with_the_result_or_2_when_the_task_failed(fleet):
    ok = cli(fleet, "demo.echo", "--key", "cli-ok", "--payload", '{"hi": 1}', "--wait",
             "--timeout", "60", "--json")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)  # stdout is only the report: logs went to stderr
    assert (report["outcome"], report["state"], report["result"]) == \
        ("created", "succeeded", {"echo": {"hi": 1}})
    failed = cli(fleet, "demo.saga", "--key", "cli-fail", "--payload", '{"fail": true}',
                 "--wait", "--timeout", "60")
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert "final state: failed" in failed.stdout
    assert "ended failed" in failed.stderr
