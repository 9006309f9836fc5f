"""The store owns every row the engine changes (docs/design.md, "The store"):
no engine module outside `workflows/engine/store/` writes, deletes or locks a
row itself. A scan of the source, and a proof that the scan finds one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ENGINE = ROOT / "workflows" / "engine"

# Methods that change or lock rows whatever they are called on.
ALWAYS = {"save", "delete", "_raw_delete", "bulk_create", "bulk_update", "select_for_update",
          "get_or_create", "update_or_create"}
# Methods that change rows when called on a model's manager or a queryset.
ON_QUERYSETS = {"update", "create"}
QUERYSET_STEPS = {"objects", "filter", "exclude", "all", "using"}

# The one exception, and why: django-q2's broker table is the broker's queue,
# not a row of PILOT's; enqueue.py is the ORM broker's push.
BROKER = {("enqueue.py", "bulk_create")}


def _chain(node: ast.AST) -> set[str]:
    """The attribute and method names a call's receiver is built from."""
    names: set[str] = set()
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
            node = node.value
        else:
            return names


def writes_in(source: str) -> list[tuple[int, str]]:
    """(line, method) of every row write or lock in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method = node.func.attr
        if method in ALWAYS or (method in ON_QUERYSETS
                                and _chain(node.func.value) & QUERYSET_STEPS):
            found.append((node.lineno, method))
    return sorted(found)


def test_no_engine_module_outside_the_store_writes_or_locks_a_row() -> None:
    offenders = []
    for path in sorted(ENGINE.rglob("*.py")):
        relative = path.relative_to(ENGINE)
        if relative.parts[0] == "store":
            continue
        for line, method in writes_in(path.read_text()):
            if (str(relative), method) not in BROKER:
                offenders.append(f"workflows/engine/{relative}:{line} .{method}()")
    assert not offenders, "row writes outside the store:\n" + "\n".join(offenders)


def test_the_scan_finds_each_kind_of_write() -> None:
    source = """
Task.objects.filter(pk=1).update(state="x")
Task.objects.create(pk=1)
rows = Task.objects.filter(pk=1)
rows.exclude(pk=2).update(state="x")
task.save(update_fields=["state"])
Task.objects.select_for_update().first()
Task.objects.bulk_create([])
schedule.delete()
fields.update(state="x")
"""
    assert [method for _, method in writes_in(source)] == [
        "update", "create", "update", "save", "select_for_update", "bulk_create", "delete"]


def test_the_store_itself_is_where_the_writes_are() -> None:
    """The scan is not vacuous: the store's own modules hold the writes."""
    in_store = sum(len(writes_in(path.read_text()))
                   for path in (ENGINE / "store").glob("*.py"))
    assert in_store >= 30


def _opens_its_own_transaction(function: ast.FunctionDef) -> bool:
    return any(isinstance(node, ast.With) and any(
        "atomic" in _chain(item.context_expr) for item in node.items)
        for node in ast.walk(function))


def _decorated(function: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "in_callers_transaction"
               for d in function.decorator_list)


def test_a_verb_that_locks_rows_in_its_callers_transaction_says_so_in_its_name() -> None:
    """A store verb that takes row locks without opening its own transaction
    runs inside its caller's: its name ends in `_in_tx` and its guard refuses a
    call outside one (database.in_callers_transaction); and every `_in_tx` verb
    carries the guard."""
    wrong = []
    for path in sorted((ENGINE / "store").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            locks = any(method == "select_for_update" for _, method in writes_in(
                ast.unparse(node)))
            named = node.name.endswith("_in_tx")
            if locks and not _opens_its_own_transaction(node) and not named:
                wrong.append(f"{path.name}: {node.name} locks rows in its caller's transaction")
            if named != _decorated(node):
                wrong.append(f"{path.name}: {node.name} name and guard disagree")
    assert not wrong, "\n".join(wrong)


def test_an_in_tx_verb_called_outside_a_transaction_is_refused(transactional_db) -> None:
    import pytest

    from workflows.engine.store import store

    with pytest.raises(RuntimeError, match="must run inside the caller's transaction"):
        store().lock_task_in_tx("00000000-0000-0000-0000-000000000000")
