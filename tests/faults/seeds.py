"""The seed of a model-based test's run (docs/testing.md, "Deeper runs"):
PILOT_MODEL_SEED when set (to replay a failure: the test prints its seed), else
one drawn from the commit under test, so that every commit explores programs of
its own instead of CI replaying the same ones forever."""

from __future__ import annotations

import os
import subprocess


def model_seed() -> int:
    """The base seed; part n of a model runs seed + n."""
    chosen = os.environ.get("PILOT_MODEL_SEED", "").strip()
    if chosen:
        return int(chosen)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = "0"
    return int(head or "0", 16) % 2**32


def landed_over_the_run(model: str, part: int, parts: int, counts: dict,
                        required: tuple[str, ...]) -> dict | None:
    """Record what part `part` of `model` saw land; once all `parts` parts of this
    test run have recorded theirs (xdist may run them in other processes: the
    run's id, PYTEST_XDIST_TESTRUNUID, names a file they share), assert that every
    `required` kind landed somewhere in the run and return the sums. A run of a
    single part asserts nothing (it returns None): a model's faults are sought by
    its rules, but 150 random programs may still miss one kind; 600 never have."""
    import fcntl
    import json
    from collections import Counter

    from tests.support.procs import ARTIFACTS

    ARTIFACTS.mkdir(exist_ok=True)
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    path = ARTIFACTS / f"{model}-landing-{run}.json"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        seen = json.loads(path.read_text()) if path.exists() else {}
        seen[str(part)] = dict(counts)
        path.write_text(json.dumps(seen))
    if len(seen) < parts:
        return None
    total: Counter = Counter()
    for part_counts in seen.values():
        total.update(part_counts)
    missing = [kind for kind in required if not total[kind]]
    assert not missing, f"{model}: no {', '.join(missing)} in the whole run: {dict(total)}"
    return dict(total)
