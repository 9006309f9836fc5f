"""Named fault points (engine/faults.py): a no-op unless armed; armed, they
crash (or raise what they are given) exactly where and as often as asked, and
say that they fired."""

import pytest
from django.db import OperationalError

from workflows.engine import faults


def test_an_unarmed_point_does_nothing():
    faults.fault_point("after_claim")


def test_an_armed_point_lets_passes_by_then_crashes_as_often_as_asked():
    with faults.armed("after_claim", skip=1, times=2) as hits:
        faults.fault_point("after_claim")  # let by
        for _ in range(2):
            with pytest.raises(faults.SimulatedCrash):
                faults.fault_point("after_claim")
        faults.fault_point("after_claim")  # spent
    assert hits.fired == 2


def test_an_armed_point_can_raise_a_given_error():
    with faults.armed("transition_reply", error=OperationalError("reply lost")) as hits, \
            pytest.raises(OperationalError, match="reply lost"):
        faults.fault_point("transition_reply")
    assert hits.fired == 1


def test_a_hook_runs_once_at_its_point():
    ran = []
    with faults.on("after_checkpoint", lambda: ran.append(1)) as hits:
        faults.fault_point("after_checkpoint")
        faults.fault_point("after_checkpoint")
    assert (ran, hits.fired) == ([1], 1)


def test_an_unknown_point_is_refused():
    with pytest.raises(ValueError, match="unknown fault point"), faults.armed("nowhere"):
        pass
