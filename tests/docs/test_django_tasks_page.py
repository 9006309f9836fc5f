"""docs/django-tasks.md: its blocks run as written — the settings are the
standalone project's, the tasks module defines tasks on PilotTaskBackend, the
enqueue block replays, a worker (the real entry point, in process) runs them and
the read-back block prints what its comment says; the owner block moves them
to an API client."""

from __future__ import annotations

import re
import sys
import types

import pytest
from django.conf import settings
from django.test import override_settings

from tests.support.helpers import drain
from tests.support.procs import ROOT
from workflows.models import Task
from workflows.registry import registry

PAGE = ROOT / "docs" / "django-tasks.md"
pytestmark = pytest.mark.django_db(transaction=True)


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), flags=re.S | re.M)


def block(first_line: str) -> str:
    [found] = [b for b in blocks() if b.startswith(first_line)]
    return found


@pytest.fixture
def shop_tasks(monkeypatch):
    """The page's shop/tasks.py as the module `shop.tasks`."""
    module = types.ModuleType("shop.tasks")
    package = types.ModuleType("shop")
    package.__path__ = []
    package.tasks = module
    monkeypatch.setitem(sys.modules, "shop", package)
    monkeypatch.setitem(sys.modules, "shop.tasks", module)
    exec(compile(block("# shop/tasks.py"), "shop/tasks.py", "exec"), module.__dict__)
    yield module
    for name in ("shop.tasks.charge", "shop.tasks.send_receipt"):
        registry.unregister(name)


def test_the_settings_block_is_the_standalone_projects_default():
    namespace: dict = {}
    exec(block("# settings.py"), namespace)
    assert namespace["TASKS"] == settings.TASKS


def test_the_pages_tasks_enqueue_once_run_and_read_back(shop_tasks, capsys):
    enqueue = next(b for b in blocks() if b.startswith("from shop.tasks import"))
    namespace: dict = {}
    exec(enqueue, namespace)
    assert Task.objects.filter(workflow="shop.tasks.charge").count() == 1
    assert Task.objects.get(pk=namespace["receipt"].id).workflow == "shop.tasks.send_receipt"
    drain()
    [read] = [b for b in blocks() if b.startswith("result = charge.get_result")]
    exec(read, namespace)
    expected = re.search(r"# (SUCCESSFUL .*)$", read, flags=re.M).group(1)
    assert capsys.readouterr().out.strip() == expected


def test_the_owner_block_gives_the_tasks_to_an_existing_user(shop_tasks, django_user_model):
    namespace: dict = {}
    exec(next(b for b in blocks() if "OWNER" in b), namespace)
    client = django_user_model.objects.create_user("shop-backend")
    with override_settings(TASKS=namespace["TASKS"]):
        result = shop_tasks.send_receipt.enqueue("b@example.com", 5)
    assert Task.objects.get(pk=result.id).owner == client
