"""The baseline PILOT: the engine as it was before the correctness and the
performance issues (commit BASELINE), measured in the same run as today's so
"before" and "after" share the machine's drift.

`tree()` extracts that commit (`git archive`, no worktree registered) into
bench/out/baseline/ and puts today's bench/ into it, so both sides run the
same measuring code and differ only in the engine; the tree shares PILOT's
virtualenv (its requirements are a subset). It gets its own database,
<bench database>_baseline (the schemas differ).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from bench.common import DB_NAME as BENCH_DB
from bench.common import OUT, ROOT, db_url

BASELINE = "7f76ac2"  # main before issue 10 (correctness) and issue 16 (performance)
DB_NAME = f"{BENCH_DB}_baseline"
TREE = OUT / "baseline"


def tree() -> Path:
    """The baseline tree, extracted once (again when bench/ changed since)."""
    marker = TREE / ".bench-baseline"
    stamp = f"{BASELINE} {_bench_stamp()}"
    if marker.exists() and marker.read_text() == stamp:
        return TREE
    shutil.rmtree(TREE, ignore_errors=True)
    TREE.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {BASELINE} failed (a clone with its history is "
                           f"needed): {archive.stderr.decode(errors='replace')[:300]}")
    subprocess.run(["tar", "-x", "-C", str(TREE)], input=archive.stdout, check=True)
    shutil.rmtree(TREE / "bench")
    shutil.copytree(ROOT / "bench", TREE / "bench",
                    ignore=shutil.ignore_patterns("out", ".venv", "__pycache__"))
    (TREE / ".venv").symlink_to(ROOT / ".venv")
    # The peers' virtualenv too: py-spy, for the baseline's profile, lives there.
    (TREE / "bench" / ".venv").symlink_to(ROOT / "bench" / ".venv")
    marker.write_text(stamp)
    return TREE


def env_overrides() -> dict:
    """What a baseline process's environment changes (on top of pilot_env)."""
    return {"DATABASE_URL": db_url(DB_NAME), "BENCH_DB": DB_NAME, "PYTHONPATH": str(TREE)}


def _bench_stamp() -> str:
    """A fingerprint of today's bench/ code (its files' contents)."""
    files = sorted(p for p in (ROOT / "bench").rglob("*.py") if "out" not in p.parts
                   and ".venv" not in p.parts)
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
