"""Which database this is, is asked in one module (docs/design.md, "The store").

The store's verbs differ by class; what else differs between databases — a
lock that serializes a decision, a statement time limit, the database's state
— is a function of `workflows/database.py`. No other module branches on
`connection.vendor`. Migrations are history and stay self-contained, so they
may ask.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.db import DatabaseError, connection, transaction

import workflows
from workflows.database import serialize, statement_time_limit
from workflows.models import Task

PACKAGE = Path(workflows.__file__).parent
DATABASE = PACKAGE / "database.py"
MIGRATIONS = PACKAGE / "migrations"


def _vendor_questions(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "vendor"]


def test_only_one_module_asks_which_database_this_is():
    asked = {str(path.relative_to(PACKAGE.parent)): lines
             for path in sorted(PACKAGE.rglob("*.py"))
             if path != DATABASE and MIGRATIONS not in path.parents
             and (lines := _vendor_questions(path))}
    assert asked == {}, f"these modules ask connection.vendor themselves: {asked}"


def test_the_scan_sees_a_vendor_question(tmp_path):
    """The scan itself finds the question it forbids (the test can fail)."""
    module = tmp_path / "m.py"
    module.write_text("from django.db import connection\n\n"
                      "if connection.vendor == 'postgresql':\n    pass\n")
    assert _vendor_questions(module) == [3]
    assert _vendor_questions(DATABASE)  # the one module does ask


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_statement_over_the_time_limit_gives_up_and_the_limit_ends_with_it():
    with pytest.raises(DatabaseError, match="statement timeout"):
        with statement_time_limit(50), connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(2)")
    with connection.cursor() as cursor:  # SET LOCAL: gone with its transaction
        cursor.execute("SELECT pg_sleep(0.1), current_setting('statement_timeout')")
        assert cursor.fetchone()[1] == "0"


@pytest.mark.django_db(transaction=True)
def test_on_sqlite_the_time_limit_opens_no_transaction_whose_begin_would_take_the_write_lock():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's side of the verb (the PostgreSQL one is above)")
    with statement_time_limit(50):
        assert not connection.in_atomic_block
        assert Task.objects.count() == 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_transactions_serialized_on_one_key_run_one_after_the_other():
    """serialize(kind, key): the second waits for the first's COMMIT; another key does not."""
    import threading

    order: list[str] = []
    first_holds, release = threading.Event(), threading.Event()

    def first():
        with transaction.atomic():
            serialize(7, "client-a")
            first_holds.set()
            release.wait(5)
            order.append("first commits")
        connection.close()

    def second(key: str):
        first_holds.wait(5)
        with transaction.atomic():
            serialize(7, key)
            order.append(f"second holds {key}")
        connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second, args=("b",)),
               threading.Thread(target=second, args=("client-a",))]
    for t in threads:
        t.start()
    first_holds.wait(5)
    threads[1].join(5)  # another key: not held back
    assert order == ["second holds b"]
    release.set()
    for t in threads:
        t.join(5)
    assert order == ["second holds b", "first commits", "second holds client-a"]


CONNECTION_NAMES = {"connection", "connections", "close_old_connections", "reset_queries"}
ENGINE = PACKAGE / "engine"


def _connection_holds(path: Path) -> list[int]:
    """Lines that take Django's connection objects themselves: `from django.db
    import connection` (or connections, close_old_connections), or
    `django.db.connection…` spelled out."""
    def holds(node: ast.AST) -> bool:
        if isinstance(node, ast.ImportFrom):
            return node.module == "django.db" and bool(
                CONNECTION_NAMES & {alias.name for alias in node.names})
        return (isinstance(node, ast.Attribute) and node.attr in CONNECTION_NAMES
                and ast.unparse(node.value) == "django.db")

    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted(node.lineno for node in ast.walk(tree) if holds(node))


def test_no_engine_module_but_the_store_holds_a_database_connection():
    """The engine reaches the database through its store's verbs; what a loop or
    a run needs of the connections themselves (drop a dead one, refresh between
    passes) is a function of workflows/database.py."""
    store_dir = ENGINE / "store"
    held = {str(path.relative_to(PACKAGE.parent)): lines
            for path in sorted(ENGINE.rglob("*.py"))
            if store_dir not in path.parents and (lines := _connection_holds(path))}
    assert held == {}, f"these engine modules hold the connection themselves: {held}"


def test_the_connection_scan_sees_both_spellings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import django.db\nfrom django.db import connections, transaction\n\n"
                      "x = django.db.connection\n")
    assert _connection_holds(module) == [2, 4]
    assert _connection_holds(ENGINE / "store" / "orm.py")  # the store does hold it
