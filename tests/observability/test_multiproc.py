"""Metrics that last (observability.multiproc): the files of dead processes are
folded into archives without changing a total, a live process's are left, an
interrupted compaction is finished without counting anything twice, and a
scrape never runs beside a compaction."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from tests.support.procs import free_port, wait_until
from workflows.observability import multiproc
from workflows.observability.multiproc import compact, scrape_lock

ROOT = Path(__file__).resolve().parents[2]

COUNT = ("import django, sys, time; django.setup(); "
         "from workflows.observability.events import emit; "
         "n = int(sys.argv[1]); "
         "[emit('task_triggered', workflow='demo.echo', outcome='created') for _ in range(n)]; "
         "[emit('step_finished', workflow='demo.echo', step='s', duration_ms=40.0) "
         " for _ in range(n)]; "
         "print('counted', flush=True); "
         "time.sleep(float(sys.argv[2]))")


def env_for(directory: Path) -> dict:
    return {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory),
            "DJANGO_SETTINGS_MODULE": "tests.settings"}


def count_in_a_process(directory: Path, n: int) -> None:
    subprocess.run([sys.executable, "-c", COUNT, str(n), "0"], cwd=ROOT, env=env_for(directory),
                   check=True, timeout=60, capture_output=True)


def merged(directory: Path) -> dict[str, float]:
    """Every sample a scrape of `directory` reports."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    with scrape_lock(str(directory)):
        text = generate_latest(registry).decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


# Histogram sums are floats added in another order after a compaction (the
# directory's order before it): equal to the last few bits, hence approx.


def db_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.db"))


def test_dead_processes_are_folded_into_archives_with_every_total_kept(tmp_path):
    for n in (1, 2, 3):
        count_in_a_process(tmp_path, n)
    before = merged(tmp_path)
    assert before['pilot_triggers_total{outcome="created",workflow="demo.echo"}'] == 6.0
    assert len(db_files(tmp_path)) == 6  # a counter and a histogram file per process
    done = compact(str(tmp_path))
    assert (done.pids, done.files) == (3, 6)
    assert db_files(tmp_path) == ["counter_archive.db", "histogram_archive.db"]
    assert merged(tmp_path) == pytest.approx(before, rel=1e-12)
    count_in_a_process(tmp_path, 4)  # more churn: folded into the same archives
    compact(str(tmp_path))
    after = merged(tmp_path)
    assert after['pilot_triggers_total{outcome="created",workflow="demo.echo"}'] == 10.0
    assert after['pilot_step_duration_seconds_count{step="s",workflow="demo.echo"}'] == 10.0
    assert after['pilot_step_duration_seconds_bucket{le="0.05",step="s",workflow="demo.echo"}'] \
        == 10.0
    assert db_files(tmp_path) == ["counter_archive.db", "histogram_archive.db"]


def test_a_live_processs_files_are_left_until_it_dies(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", COUNT, "5", "60"], cwd=ROOT,
                            env=env_for(tmp_path), stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline().strip() == "counted"
        count_in_a_process(tmp_path, 1)
        assert compact(str(tmp_path)).pids == 1
        assert f"counter_{live.pid}.db" in db_files(tmp_path)
        total = merged(tmp_path)['pilot_triggers_total{outcome="created",workflow="demo.echo"}']
        assert total == 6.0
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(10)
        live.stdout.close()
    assert compact(str(tmp_path)).pids == 1
    assert db_files(tmp_path) == ["counter_archive.db", "histogram_archive.db"]
    assert merged(tmp_path)['pilot_triggers_total{outcome="created",workflow="demo.echo"}'] == 6.0


def _interrupt_after_journal(directory: Path) -> None:
    """A compaction that died after writing its journal, before applying it."""
    dead = multiproc.dead_files(str(directory))
    absorbed = {"counter": [n for names in dead.values() for n in names
                            if n.startswith("counter_")]}
    replacements = {"counter": multiproc._write_archive(str(directory), "counter",
                                                        absorbed["counter"])}
    multiproc._write_journal(str(directory), replacements, absorbed)


def test_an_interrupted_compaction_is_finished_without_counting_twice(tmp_path):
    count_in_a_process(tmp_path, 2)
    compact(str(tmp_path))
    count_in_a_process(tmp_path, 3)
    before = merged(tmp_path)
    _interrupt_after_journal(tmp_path)
    compact(str(tmp_path))
    assert merged(tmp_path) == pytest.approx(before, rel=1e-12)
    assert not (tmp_path / ".compaction.json").exists()
    assert db_files(tmp_path) == ["counter_archive.db", "histogram_archive.db"]


def test_a_compaction_interrupted_before_its_journal_leaves_nothing_behind(tmp_path):
    count_in_a_process(tmp_path, 2)
    before = merged(tmp_path)
    dead = multiproc.dead_files(str(tmp_path))
    multiproc._write_archive(str(tmp_path), "counter",
                             [n for names in dead.values() for n in names])
    # A temporary archive is invisible to a scrape.
    assert merged(tmp_path) == pytest.approx(before, rel=1e-12)
    compact(str(tmp_path))
    assert merged(tmp_path) == pytest.approx(before, rel=1e-12)
    assert not list(tmp_path.glob("*.tmp"))


def test_no_compaction_while_a_scrape_reads(tmp_path):
    count_in_a_process(tmp_path, 1)
    with scrape_lock(str(tmp_path)):
        assert compact(str(tmp_path)).files == 0
    assert compact(str(tmp_path)).files == 2


@pytest.mark.slow
def test_the_exporter_serves_a_worker_only_machines_metrics(tmp_path):
    count_in_a_process(tmp_path, 3)
    port = free_port()
    env = {**env_for(tmp_path), "DATABASE_URL": f"sqlite:///{tmp_path}/none.sqlite3",
           "PILOT_METRICS_TOKEN": "scrape-token-123"}
    exporter = subprocess.Popen(
        [sys.executable, "manage.py", "pilot_metrics_exporter", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def answers():
            try:
                return httpx.get(url, timeout=1)
            except httpx.HTTPError:
                return None

        denied = wait_until(answers, 30, what="the exporter")
        assert denied.status_code == 401
        r = httpx.get(url, headers={"Authorization": "Bearer scrape-token-123"})
        assert r.status_code == 200
        assert re.search(r'pilot_triggers_total\{outcome="created",workflow="demo.echo"\} 3\.0',
                         r.text)
        assert "pilot_database_up 0.0" in r.text
        # The dead process's files are folded; only the exporter's own remain beside.
        assert {re.sub(r"_\d+\.db$", f"_{exporter.pid}.db", f) for f in db_files(tmp_path)} \
            <= {"counter_archive.db", "histogram_archive.db",
                f"counter_{exporter.pid}.db", f"histogram_{exporter.pid}.db"}
        assert not [f for f in db_files(tmp_path)
                    if re.search(r"_\d+\.db$", f) and f"_{exporter.pid}." not in f]
        assert httpx.get(f"http://127.0.0.1:{port}/admin/").status_code == 404
    finally:
        exporter.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while exporter.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if exporter.poll() is None:
            exporter.kill()
        exporter.wait(5)
    output = exporter.stdout.read()
    exporter.stdout.close()
    assert exporter.returncode == 0, output
