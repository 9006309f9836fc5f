"""Children and versions in the console: a parent's children by state with
links into the list, a child's parent, the list filtered by parent and by
version, the workflows page's tasks not finished per version, a task's wait
for its children explained."""

from __future__ import annotations

import re
import uuid

import pytest
from django.urls import reverse

from tests.admin.conftest import LIST_URL, task_url
from tests.support.helpers import pop_queued, versioned_v2
from workflows.engine.triggers import task_trigger
from workflows.models import Task
from workflows.registry import registry
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


def parked_parent(owner, children=3):
    parent = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="demo.fanout",
                          payload={"children": children}).task
    assert str(parent.pk) in pop_queued()
    run_task(str(parent.pk))
    parent.refresh_from_db()
    assert parent.state == S.WAITING
    return parent


def test_the_parents_page_counts_its_children_by_state_and_a_childs_page_links_its_parent(
        owner, operator_client):
    parent = parked_parent(owner)
    first = Task.objects.get(parent=parent, parent_index=0)
    run_task(str(first.pk))
    page = operator_client.get(task_url(parent)).content.decode()
    assert f'?parent={parent.pk}">3</a>' in page
    assert re.search(r'data-children-state="pending">2 pending<', page)
    assert re.search(r'data-children-state="succeeded">1 succeeded<', page)
    assert "Waiting for" in page and "its children</a> to end" in page
    child_page = operator_client.get(task_url(first)).content.decode()
    assert reverse("admin:workflows_task_change", args=[parent.pk]) in child_page
    assert "its step spawn, child 1" in child_page


def test_the_list_filters_a_parents_children_and_refuses_a_bad_parent(owner, operator_client):
    parent = parked_parent(owner, children=2)
    other = parked_parent(owner, children=1)
    page = operator_client.get(f"{LIST_URL}?parent={parent.pk}").content.decode()
    ids = {str(t.pk)[:8] for t in Task.objects.filter(parent=parent)}
    assert all(i in page for i in ids)
    assert str(Task.objects.get(parent=other).pk)[:8] not in page
    assert str(other.pk)[:8] not in page
    bad = operator_client.get(f"{LIST_URL}?parent=not-a-task", follow=True)
    assert bad.status_code == 200
    assert "parent is not a task id" in " ".join(str(m) for m in bad.context["messages"])


def test_the_workflows_page_shows_per_version_the_tasks_not_finished(owner, operator_client):
    before = registry.versions("demo.versioned")
    v1_task = task_trigger(owner=owner, key="v1", workflow="demo.versioned", payload={}).task
    registry.register(versioned_v2())
    try:
        task_trigger(owner=owner, key="v2a", workflow="demo.versioned", payload={})
        task_trigger(owner=owner, key="v2b", workflow="demo.versioned", payload={})
        page = operator_client.get(reverse("admin:workflows_task_workflows")).content.decode()
        section = page[page.index('data-workflow="demo.versioned"'):]
        section = section[:section.index('class="pilot-table pilot-steps"')]
        rows = dict(re.findall(r'<tr data-version="(\d)">.*?<td data-open>(.*?)</td>', section,
                               re.S))
        assert ">2</a>" in rows["2"] and "version=2" in rows["2"]
        assert ">1</a>" in rows["1"] and "version=1" in rows["1"]
        assert "(newest" in section
        listed = operator_client.get(f"{LIST_URL}?workflow=demo.versioned&version=1")
        assert str(v1_task.pk)[:8] in listed.content.decode()
        # Version 1 gone from the code while its task still waits: said so.
        registry.unregister("demo.versioned", 1)
        page = operator_client.get(reverse("admin:workflows_task_workflows")).content.decode()
        section = page[page.index('data-workflow="demo.versioned"'):]
        assert "WorkflowVersionMissing" in section
    finally:
        registry.unregister("demo.versioned")
        for wf in before:
            registry.register(wf)
