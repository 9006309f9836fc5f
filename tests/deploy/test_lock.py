"""The lock files (`make lock`) pin exactly what requirements*.txt pin, each with
hashes, so `make run`/`make test` (and the Docker image) install what was tested,
file for file."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, str]:
    found = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        match = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s\\;]+)", line)
        if match:
            found[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(3)
    return found


def test_requirements_lock_pins_what_requirements_txt_pins():
    assert pins(ROOT / "requirements.lock") == pins(ROOT / "requirements.txt")


def test_requirements_dev_lock_pins_the_runtime_and_the_test_tools():
    dev = pins(ROOT / "requirements-dev.txt") | pins(ROOT / "requirements.txt")
    assert pins(ROOT / "requirements-dev.lock") == dev


def test_every_locked_requirement_carries_its_hashes():
    for name in ("requirements.lock", "requirements-dev.lock"):
        text = (ROOT / name).read_text()
        entries = re.split(r"\n(?=[A-Za-z])", text.split("\n", 6)[-1])
        for entry in entries:
            if re.match(r"[A-Za-z]", entry):
                assert "--hash=sha256:" in entry, f"{name}: {entry.splitlines()[0]}"
        assert "-e " not in text and "file://" not in text


def test_make_installs_from_the_locks_with_hashes_required():
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r requirements.lock" in makefile
    assert "--require-hashes -r requirements-dev.lock" in makefile
    assert "-r requirements.txt" not in makefile
    assert "--require-hashes -r requirements.lock" in (ROOT / "Dockerfile").read_text()
