"""docs/writing-workflows.md: the example workflow of "Testing a workflow" and
its tests, and the examples of "Children" and "Versions", run as written (so
the page cannot rot), on whichever database this run uses."""

from __future__ import annotations

import re

import pytest

from tests.support.procs import ROOT
from workflows.models import Task
from workflows.registry import registry
from workflows.testing import run_workflow

PAGE = ROOT / "docs" / "writing-workflows.md"


def example(filename: str) -> str:
    """The python block of the page that starts with `# <filename>`."""
    [block] = [b for b in re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(),
                                     flags=re.S | re.M) if b.startswith(f"# {filename}\n")]
    return block


@pytest.fixture
def shop_workflow():
    exec(compile(example("shop/pilot_workflows.py"), "shop/pilot_workflows.py", "exec"), {})
    yield registry.get("shop.fulfil")
    registry.unregister("shop.fulfil")


def page_tests() -> dict:
    namespace: dict = {}
    exec(compile(example("shop/tests/test_fulfil.py"), "shop/tests/test_fulfil.py", "exec"),
         namespace)
    return {name: fn for name, fn in namespace.items() if name.startswith("test_")}


def test_the_page_has_its_example():
    assert re.findall(r"def (test_\w+)", example("shop/tests/test_fulfil.py")) == [
        "test_an_order_is_reserved_then_shipped",
        "test_a_crash_after_the_reservation_does_not_reserve_twice",
        "test_an_order_that_cannot_ship_releases_its_reservation",
        "test_a_bad_payload_is_refused_before_anything_runs",
    ]
    assert "from workflows.testing import run_workflow" in example("shop/tests/test_fulfil.py")


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(page_tests()))
def test_the_pages_tests_pass_as_written(name, shop_workflow):
    page_tests()[name]()


@pytest.mark.django_db
def test_the_pages_tests_can_fail(shop_workflow):
    """Against the same workflow with `reserve` made a plain step (no atomic
    commit to crash after), the page's crash test fails: it tests something."""
    reserve = shop_workflow.steps[0]
    shop_workflow.steps[0] = type(reserve)(name=reserve.name, func=reserve.func, atomic=False,
                                           compensation=reserve.compensation)
    with pytest.raises(AssertionError):
        page_tests()["test_a_crash_after_the_reservation_does_not_reserve_twice"]()


# --- "Children" and "Versions": their examples run as written ----------------------

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
