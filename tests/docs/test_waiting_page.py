"""docs/waiting.md: the example workflow runs as written, through the real
engine (run_workflow), approved, rejected and unanswered."""

from __future__ import annotations

import pytest

from tests.docs.blocks import checked_by
from tests.support.procs import ROOT
from workflows.models import DemoLedger
from workflows.registry import registry
from workflows.testing import run_workflow

PAGE = ROOT / "docs" / "waiting.md"


@pytest.fixture
def refund():
    [block] = checked_by(PAGE, "test_an_approved_refund_waits_then_pays_once")
    exec(compile(block, "shop/pilot_workflows.py", "exec"), {})
    yield registry.get("shop.refund")
    registry.unregister("shop.refund")


def paid(task):
    return list(DemoLedger.objects.filter(task=task.pk).values_list("action", flat=True))


@pytest.mark.django_db
def test_an_approved_refund_waits_then_pays_once(refund):
    task = run_workflow("shop.refund", {"amount": 30, "grace_seconds": 600},
                        signals={"approval": {"approved": True}})
    assert (task.state, task.result) == ("succeeded", {"paid": 30})
    assert [s.name for s in task.steps.all()] == ["check", "approval", "grace", "pay"]
    assert paid(task) == ["pay"]


@pytest.mark.django_db
def test_a_rejected_refund_pays_nothing_and_an_unanswered_one_times_out(refund):
    rejected = run_workflow("shop.refund", {"amount": 30},
                            signals={"approval": {"approved": False}})
    assert (rejected.state, rejected.result, paid(rejected)) == ("succeeded", {"paid": 0}, [])
    unanswered = run_workflow("shop.refund", {"amount": 30})
    assert (unanswered.state, unanswered.error_type) == ("failed", "SignalTimeout")
