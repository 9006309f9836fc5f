"""The lock files (`make lock`) pin exactly what requirements*.txt pin, each with
hashes, so `make run`/`make test` (and the Docker image) install what was tested,
file for file. requirements-django6.lock and requirements-min.lock are the dev set
with the pins of requirements-django6.txt or requirements-min.txt in their place;
requirements-min.txt pins pyproject.toml's lower bounds."""

import re
import tomllib
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


def overlaid(name: str) -> dict[str, str]:
    """The dev set with requirements-<name>.txt's pins in place of its own (the
    Makefile's OVERLAY)."""
    return pins(ROOT / "requirements-dev.txt") | pins(ROOT / "requirements.txt") \
        | pins(ROOT / f"requirements-{name}.txt")


def test_the_django6_and_min_locks_pin_the_dev_set_with_their_overrides():
    for name in ("django6", "min"):
        locked = pins(ROOT / f"requirements-{name}.lock")
        wanted = overlaid(name)
        assert {k: locked.get(k) for k in wanted} == wanted, name
        # Anything else is what an older version pulls in (croniter 6.0: pytz).
        assert set(locked) - set(wanted) <= {"pytz"}, name


def test_the_django6_lock_is_the_newest_django_6():
    django = pins(ROOT / "requirements-django6.txt")["django"]
    assert django.startswith("6."), django


def test_requirements_min_pins_every_declared_lower_bound():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["postgres"]]
    low = pins(ROOT / "requirements-min.txt")
    for requirement in declared:
        match = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?>=([0-9.]+)", requirement)
        assert match, f"{requirement}: no lower bound"
        name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        # 6.0 and 6.0.0 are one version.
        assert low.get(name, "").removesuffix(".0").removesuffix(".0") \
            == match.group(3).removesuffix(".0").removesuffix(".0"), requirement


def test_every_locked_requirement_carries_its_hashes():
    for name in ("requirements.lock", "requirements-dev.lock", "requirements-django6.lock",
                 "requirements-min.lock"):
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
    assert "--require-hashes -r requirements-django6.lock" in makefile
    assert "--require-hashes -r requirements-min.lock" in makefile
    assert "-r requirements.txt" not in makefile
    assert "--require-hashes -r requirements.lock" in (ROOT / "Dockerfile").read_text()
