"""Event names are said once (workflows/observability/events.py, `Event`): every
event the code reports is a member, and every member is reported somewhere."""

import ast
from pathlib import Path

from workflows.observability.events import Event

ROOT = Path(__file__).resolve().parents[2] / "workflows"
EMITTERS = {"emit", "emit_on_commit", "_emit"}


def _calls():
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in EMITTERS:
                    yield path, node


def test_no_event_is_reported_by_a_bare_string():
    bare = [f"{path.relative_to(ROOT)}:{node.lineno}" for path, node in _calls()
            if isinstance(node.args[0], (ast.Constant, ast.JoinedStr))]
    assert bare == []


def test_every_event_is_reported_somewhere():
    source = "\n".join(p.read_text() for p in ROOT.rglob("*.py")
                       if p.name != "events.py")
    loops = {f"{loop}_{what}" for loop in ("dispatcher", "scheduler")
             for what in ("started", "pass", "db_unavailable", "error", "stopped")}
    unused = [e.name for e in Event if f"Event.{e.name}" not in source and e.value not in loops]
    assert unused == []
