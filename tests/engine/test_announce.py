"""Acting on what the store did (engine/announce.py): a transition's event and
the webhook message its ending owes, each once, on commit — never for a change
that rolled back."""

import pytest
from django.db import transaction

from tests.factories import make_task, transition_kwargs
from tests.support.helpers import purge_queue, queued_webhooks
from workflows.engine.announce import announce, move
from workflows.engine.store import store
from workflows.observability.events import Event, add_listener, remove_listener
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)

URL = "https://receiver.example.com/hooks"


@pytest.fixture
def transitions():
    seen = []

    def listen(event, fields):
        if event == Event.TASK_TRANSITIONED:
            seen.append((fields["transition"], fields["from_state"], fields["to_state"]))

    add_listener(listen)
    yield seen
    remove_listener(listen)


def test_an_ending_is_announced_once_with_its_webhook(owner, transitions):
    task = make_task(owner, state=S.RUNNING, callback_url=URL)
    purge_queue()
    transitions.clear()
    fact = move(task, "succeed", at=store().db_now(), actor="test",
                **transition_kwargs("succeed", task))
    assert transitions == [("succeed", S.RUNNING, S.SUCCEEDED)]
    assert queued_webhooks() == [fact.delivery] == [f"{task.pk}:{S.SUCCEEDED}:0"]


def test_the_store_alone_announces_nothing(owner, transitions):
    task = make_task(owner, state=S.RUNNING, callback_url=URL)
    purge_queue()
    transitions.clear()
    fact = store().transition(task, "succeed", at=store().db_now(), actor="test",
                              **transition_kwargs("succeed", task))
    assert (transitions, queued_webhooks()) == ([], [])
    announce(fact)
    assert transitions == [("succeed", S.RUNNING, S.SUCCEEDED)]
    assert queued_webhooks() == [fact.delivery]


def test_a_success_that_claimed_the_next_task_announces_both(owner, transitions):
    from datetime import timedelta

    held = store().claim(make_task(owner).pk, worker="w", lease=timedelta(seconds=60))
    nxt = make_task(owner)
    transitions.clear()
    announce(held)
    fact = store().transition(held.task, "succeed", at=held.db_now, actor="worker:w",
                              steps=[], then_claim_for=("w", timedelta(seconds=60)),
                              **transition_kwargs("succeed", held.task))
    announce(fact)
    assert fact.following is not None and fact.following.task.pk == nxt.pk
    assert transitions == [("claim", S.PENDING, S.RUNNING), ("succeed", S.RUNNING, S.SUCCEEDED),
                           ("claim", S.PENDING, S.RUNNING)]


def test_a_rolled_back_transition_announces_nothing(owner, transitions):
    task = make_task(owner, state=S.RUNNING, callback_url=URL)
    purge_queue()
    transitions.clear()
    with pytest.raises(RuntimeError), transaction.atomic():
        move(task, "succeed", at=store().db_now(), actor="test",
             **transition_kwargs("succeed", task))
        raise RuntimeError("the caller's transaction fails after the move")
    assert (transitions, queued_webhooks()) == ([], [])


def test_nothing_to_announce_does_nothing(transitions):
    announce(None)
    assert transitions == []
