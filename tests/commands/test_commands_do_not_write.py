"""Commands (and the other thin doors this issue adds) never change state
themselves: they call the engine or a service (STYLE "A shape for workflows/")."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIN = [ROOT / "workflows" / "management", ROOT / "workflows" / "worker.py",
        ROOT / "workflows" / "observability"]
# As plain as the pre-commit hook that greps for the same strings: even a
# comparison `.state ==` or a dict's `.update(` would trip it, so none appear.
FORBIDDEN = re.compile(r"\.save\(|\.update\(|select_for_update|\.state =")


def sources():
    for place in THIN:
        yield from ([place] if place.is_file() else sorted(place.rglob("*.py")))


@pytest.mark.parametrize("path", list(sources()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_state_writes_outside_the_engine(path):
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if FORBIDDEN.search(line)]
    assert hits == []


def test_the_guard_sees_a_write():
    assert FORBIDDEN.search("task.save(update_fields=['x'])")
    assert FORBIDDEN.search("Task.objects.filter(pk=1).update(state='x')")
    assert FORBIDDEN.search("task.state = 'running'")
    assert not FORBIDDEN.search("if task.is_finished:")
