"""Prometheus multiprocess files that last: dead processes compacted away.

In multiprocess mode (PROMETHEUS_MULTIPROC_DIR) every process that counts
something writes `counter_<pid>.db` and `histogram_<pid>.db`, and a scrape
reads every file in the directory. A django-q2 worker is recycled every 500
tasks and a gunicorn worker now and then, and each leaves its files behind:
after a week at ~10 runs/s that is ~10 000 files and a scrape reads them all
(measured: 0.48 s at 2 000 files, 2.7 s at 10 000, linear).

`compact(directory)` folds the files of dead processes into one archive per
type (`counter_archive.db`, `histogram_archive.db`, `summary_archive.db`) —
counters and histogram buckets are sums, so the totals a scrape reports do not
change — removes them, and marks the processes dead for prometheus-client's
live gauges (`mark_process_dead`). The directory then holds the live processes'
files plus three, and a scrape costs the same on day 7 as on day 1
(bench/workloads/metrics_churn.py: `make bench BENCH_ONLY=metrics`).

A process is dead when no process of its pid exists on this machine (the
directory is per machine). Gauge files other than the live modes are left
alone: PILOT writes none (its gauges are read at scrape time).

Consistency. A scrape must never see a dead process's values twice (in the
archive and in its own file) or not at all, or a counter would seem to jump
or reset. Scrapes hold a shared `flock` on `.lock` in the directory while they
read (`scrape_lock`); compaction holds it exclusively. Compaction is also
crash-safe: the new archives are written to temporary files, then a journal
names them and the files they absorb, then they replace the archives and the
absorbed files are removed, then the journal goes. A compaction interrupted
after the journal was written is finished by the next one; one interrupted
before it left only temporary files, which are discarded.

Who compacts: `run_workers` (every COMPACT_EVERY_SECONDS, on every worker
machine), every scrape (`exposition()`: dead files found are compacted first),
`pilot_metrics_exporter`, and gunicorn's `child_exit` hook marks its workers
dead as they go (deploy/gunicorn.conf.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import mark_process_dead

ARCHIVED_TYPES = ("counter", "histogram", "summary")
ARCHIVE_PID = "archive"
COMPACT_EVERY_SECONDS = 60.0
_LOCK = ".lock"
_JOURNAL = ".compaction.json"
_FILE = re.compile(r"^(?P<typ>counter|histogram|summary|gauge_[a-z]+)_(?P<pid>\d+)\.db$")


@dataclass(frozen=True)
class Compaction:
    pids: int = 0    # dead processes compacted
    files: int = 0   # files folded into the archives and removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    except OSError as exc:  # e.g. a pid above pid_max
        return exc.errno != errno.ESRCH
    return True


def dead_files(directory: str) -> dict[int, list[str]]:
    """{pid: [file names]} of the processes with files here that no longer run."""
    by_pid: dict[int, list[str]] = defaultdict(list)
    for name in os.listdir(directory):
        match = _FILE.match(name)
        if match:
            by_pid[int(match["pid"])].append(name)
    return {pid: names for pid, names in by_pid.items() if not pid_alive(pid)}


@contextlib.contextmanager
def _flock(directory: str, mode: int, *, blocking: bool = True):
    fd = os.open(os.path.join(directory, _LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, mode | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def scrape_lock(directory: str):
    """Held (shared) while a scrape reads the directory."""
    return _flock(directory, fcntl.LOCK_SH)


def compact(directory: str, *, blocking: bool = False) -> Compaction:
    """Fold the files of dead processes into the archives (see the module doc).
    Without `blocking`, returns at once (nothing done) when another process is
    compacting or scraping. Returns what it folded."""
    with _flock(directory, fcntl.LOCK_EX, blocking=blocking) as locked:
        if not locked:
            return Compaction()
        _finish_interrupted(directory)
        dead = dead_files(directory)
        if not dead:
            return Compaction()
        absorbed: dict[str, list[str]] = defaultdict(list)
        for names in dead.values():
            for name in names:
                typ = _FILE.match(name)["typ"]  # type: ignore[index]  # dead_files matched it
                if typ in ARCHIVED_TYPES:
                    absorbed[typ].append(name)
        replacements = {}
        for typ, names in absorbed.items():
            replacements[typ] = _write_archive(directory, typ, names)
        _write_journal(directory, replacements, absorbed)
        _apply_journal(directory)
        for pid in dead:
            mark_process_dead(pid, directory)  # the live gauges of the dead
        return Compaction(pids=len(dead), files=sum(len(n) for n in absorbed.values()))


def _archive_name(typ: str) -> str:
    return f"{typ}_{ARCHIVE_PID}.db"


def _write_archive(directory: str, typ: str, names: list[str]) -> str:
    """A new archive for `typ`: the current one plus `names`, summed per key,
    written to a temporary file (returned). Nothing visible changes yet."""
    totals: dict[str, float] = defaultdict(float)
    sources = [_archive_name(typ), *names]
    for name in sources:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            continue
        for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(path):
            totals[key] += value
    tmp = os.path.join(directory, f".{typ}_{ARCHIVE_PID}.db.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    archive = MmapedDict(tmp)
    try:
        for key, value in totals.items():
            archive.write_value(key, value, 0.0)
    finally:
        archive.close()
    _fsync(tmp)
    return os.path.basename(tmp)


def _write_journal(directory: str, replacements: dict[str, str],
                   absorbed: dict[str, list[str]]) -> None:
    path = os.path.join(directory, _JOURNAL)
    tmp = path + ".tmp"
    with open(tmp, "w") as out:
        json.dump({"replace": {_archive_name(t): tmp_name
                               for t, tmp_name in replacements.items()},
                   "remove": sorted(n for names in absorbed.values() for n in names)}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    _fsync_dir(directory)


def _apply_journal(directory: str) -> None:
    """Make the journal's archives current and remove what they absorbed; an
    archive already moved (an interrupted run) is not moved again."""
    path = os.path.join(directory, _JOURNAL)
    with open(path) as journal:
        plan = json.load(journal)
    for archive, tmp in plan["replace"].items():
        tmp_path = os.path.join(directory, tmp)
        if os.path.exists(tmp_path):
            os.replace(tmp_path, os.path.join(directory, archive))
    for name in plan["remove"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
    _fsync_dir(directory)
    os.unlink(path)


def _finish_interrupted(directory: str) -> None:
    if os.path.exists(os.path.join(directory, _JOURNAL)):
        _apply_journal(directory)
    for name in os.listdir(directory):  # temporary archives of a run without a journal
        if name.endswith(".db.tmp") or name == _JOURNAL + ".tmp":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):
        _fsync(directory)
