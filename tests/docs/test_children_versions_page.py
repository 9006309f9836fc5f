"""docs/writing-workflows.md, "Children" and "Versions": the examples run as
written through the real engine (run_workflow), on whichever database this
run uses."""

from __future__ import annotations

import re

import pytest

from tests.support.procs import ROOT
from workflows.models import Task
from workflows.registry import registry
from workflows.testing import run_workflow

PAGE = ROOT / "docs" / "writing-workflows.md"


def example(filename: str) -> str:
    [block] = [b for b in re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(),
                                     flags=re.S | re.M) if b.startswith(f"# {filename}\n")]
    return block


@pytest.fixture
def reports():
    exec(compile(example("reports/pilot_workflows.py"), "reports/pilot_workflows.py", "exec"),
         {})
    yield
    registry.unregister("reports.book")
    registry.unregister("reports.page")


@pytest.fixture
def orders():
    exec(compile(example("orders/pilot_workflows.py"), "orders/pilot_workflows.py", "exec"), {})
    yield
    registry.unregister("orders.fulfil")


@pytest.mark.django_db
def test_the_book_fans_out_a_child_per_page_and_binds_their_results_in_order(reports):
    book = run_workflow("reports.book", {"pages": 3})
    assert (book.state, book.result) == ("succeeded", {"pages": 3, "words": 600})
    pages = Task.objects.filter(parent=book).order_by("parent_index")
    assert [p.payload for p in pages] == [{"page": 1}, {"page": 2}, {"page": 3}]
    assert book.children_count == 3


@pytest.mark.django_db
def test_a_crash_after_the_split_starts_no_page_twice(reports):
    book = run_workflow("reports.book", {"pages": 2}, crash_at="after_step_body")
    assert book.state == "succeeded"
    assert Task.objects.filter(parent=book).count() == 2


@pytest.mark.django_db
def test_the_orders_example_registers_two_versions_and_triggers_run_the_newest(orders):
    assert [w.version for w in registry.versions("orders.fulfil")] == [1, 2]
    task = run_workflow("orders.fulfil", {"sku": "A-1"})
    assert task.version == 2
    assert [s.name for s in task.steps.all()] == ["reserve", "check_fraud", "ship"]
