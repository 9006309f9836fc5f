"""Each engine module has a test home of its own (docs/testing.md, "Where tests
live"): a file here named for it (or, for the run and the store, a file
or folder of their own), which imports it. The risk folders — windows/,
faults/, acceptance/, concurrency/ — test across modules and stay as they are."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "workflows" / "engine"

# The homes that are not tests/engine/test_<module>.py.
HOMES = {
    "run": ["tests/engine/test_runner.py"],
    "store": ["tests/engine/store"],
    "replays": ["tests/engine/test_replays_fold.py"],
    "cleanup": ["tests/commands/test_cleanup_tasks.py"],
    "signals": ["tests/engine/test_waiting.py"],
}


def engine_modules() -> list[str]:
    names = [p.stem for p in ENGINE.glob("*.py") if p.stem != "__init__"]
    return sorted(names + [p.name for p in ENGINE.iterdir() if (p / "__init__.py").exists()])


def home_of(module: str) -> list[Path]:
    return [ROOT / h for h in HOMES.get(module, [f"tests/engine/test_{module}.py"])]


def imports_of(path: Path) -> set[str]:
    files = path.rglob("test_*.py") if path.is_dir() else [path]
    found = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
    return found


def test_every_engine_module_has_a_home_that_imports_it():
    homeless = []
    for module in engine_modules():
        homes = home_of(module)
        target = f"workflows.engine.{module}"
        if not all(h.exists() for h in homes):
            homeless.append(f"{module}: no {', '.join(str(h.relative_to(ROOT)) for h in homes)}")
        elif not any(name == target or name.startswith(target + ".")
                     for h in homes for name in imports_of(h)):
            homeless.append(f"{module}: its home does not import {target}")
    assert homeless == []


def test_the_homes_table_names_only_modules_that_exist():
    assert set(HOMES) <= set(engine_modules())
