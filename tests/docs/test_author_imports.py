"""An author meets one door (docs/design.md, "Layers and doors"): the README,
the docs' code, the demo workflows and the test apps import PILOT through
`workflows.sdk` — and, where an author's code needs more than a workflow, the
other doors meant for them: `workflows.testing` (an author's tests),
`workflows.urls` (a host's URLconf), `workflows.conf` (reading a setting),
`workflows.django_tasks` (Django's `@task` with PILOT's options, `heartbeat`). The
demo's own tables (`workflows.models`: DemoLedger, DemoOrder) stand in for an
author's models."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOORS = {"workflows.sdk", "workflows.testing", "workflows.urls", "workflows.conf",
         "workflows.django_tasks"}
DEMO_TABLES = {"DemoLedger", "DemoOrder"}


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def sources() -> dict[str, str]:
    found = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, block in enumerate(python_blocks(doc.read_text())):
            found[f"{doc.relative_to(ROOT)}#{i}"] = block
    for folder in ("workflows/demo", "tests/testapp", "tests/host_project"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "migrations" not in path.parts and not path.name.startswith("test_"):
                found[str(path.relative_to(ROOT))] = path.read_text()
    return found


def wrong_imports(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # a fragment of code, not a module
    wrong = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workflows"):
            names = {a.name for a in node.names}
            if node.module in DOORS or (node.module == "workflows.models"
                                        and names <= DEMO_TABLES):
                continue
            wrong.append(f"from {node.module} import {', '.join(sorted(names))}")
        elif isinstance(node, ast.Import):
            wrong += [f"import {a.name}" for a in node.names
                      if a.name.startswith("workflows") and a.name not in DOORS]
    return wrong


def test_authors_code_imports_pilot_through_its_doors_only():
    found = {where: wrong for where, source in sources().items()
             if (wrong := wrong_imports(source))}
    assert found == {}


def test_the_scan_sees_a_wrong_import_and_real_code():
    assert wrong_imports("from workflows.engine.store import store") == [
        "from workflows.engine.store import store"]
    assert wrong_imports("from workflows.models import Task") == [
        "from workflows.models import Task"]
    assert len(sources()) > 10
