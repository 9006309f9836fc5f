"""STYLE's guard rail: admin (and the other callers of the engine) never change
state themselves. A cheap grep; the engine is the only writer."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "workflows"
CALLERS = ["admin", "api", "management", "worker.py"]
FORBIDDEN = re.compile(r"\.save\(|\.update\(|select_for_update|\.state *= ")


def test_admin_and_other_callers_contain_no_state_writes():
    offenders = []
    for name in CALLERS:
        target = ROOT / name
        files = [target] if target.is_file() else sorted(target.rglob("*.py"))
        for path in files:
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if FORBIDDEN.search(line) and not line.lstrip().startswith("#"):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []
    assert (ROOT / "admin" / "tasks.py").exists()  # the guard really looks at the admin
