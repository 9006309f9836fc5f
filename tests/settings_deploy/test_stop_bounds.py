"""The deployment files keep the stop bound of docs/operations.md "Stopping":
every unit is stopped within TimeoutStopSec=10, each process ends its own
work within PILOT_STOP_SECONDS (8 s) before that, and nothing signals qcluster's
own processes behind run_workers' back."""

import configparser
import runpy

import pytest
from django.conf import settings

from tests.support.procs import ROOT

UNITS = ["pilot-web", "pilot-worker", "pilot-dispatcher"]


def unit(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(ROOT / "deploy" / "systemd" / f"{name}.service")
    return parser["Service"]


@pytest.mark.parametrize("name", UNITS)
def test_each_unit_is_stopped_within_10_s_by_signalling_its_main_process_only(name):
    service = unit(name)
    assert service["TimeoutStopSec"] == "10"
    assert service["KillMode"] == "mixed"
    assert settings.PILOT_STOP_SECONDS + 1 < int(service["TimeoutStopSec"])


def test_workers_run_under_run_workers_everywhere():
    assert unit("pilot-worker")["ExecStart"].endswith("manage.py run_workers")
    procfile = dict(line.split(": ", 1) for line in
                    (ROOT / "Procfile").read_text().splitlines() if line.strip())
    assert procfile["worker"] == "python manage.py run_workers"


def test_gunicorn_lets_requests_finish_for_the_same_bound(monkeypatch):
    monkeypatch.delenv("PILOT_STOP_SECONDS", raising=False)
    conf = runpy.run_path(str(ROOT / "deploy" / "gunicorn.conf.py"))
    assert conf["graceful_timeout"] == settings.PILOT_STOP_SECONDS == 8
    monkeypatch.setenv("PILOT_STOP_SECONDS", "5")
    assert runpy.run_path(str(ROOT / "deploy" / "gunicorn.conf.py"))["graceful_timeout"] == 5
