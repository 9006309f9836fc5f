"""deploy/prometheus/pilot-alerts.yml and deploy/grafana/pilot-dashboard.json load,
and name only metrics PILOT exports.

With promtool (Debian's `prometheus` package; `make test` installs it when
missing): `promtool check rules`, the alert unit tests
(`promtool test rules pilot-alerts.test.yml`), and every dashboard query parsed
by promtool too. Without it, the structural checks below still run and the
promtool test says it was skipped and why.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import yaml
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "pilot-alerts.yml"
RULES_TESTS = ROOT / "deploy" / "prometheus" / "pilot-alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "pilot-dashboard.json"

# Names in PromQL that are not metrics.
_PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "rate", "increase", "irate",
    "histogram_quantile", "and", "or", "unless", "le", "absent", "clamp_min", "on",
    "ignoring", "group_left", "group_right", "bool", "offset", "time", "vector",
}


def metric_names(expr: str) -> set[str]:
    without_labels = re.sub(r"\{[^}]*\}", "", expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    without_strings = re.sub(r'"[^"]*"', "", without_ranges)
    without_strings = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", without_strings)
    return {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_strings)
            if w not in _PROMQL_WORDS and not re.fullmatch(r"\d+", w)}


def rules() -> list[dict]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"]
            for target in panel["targets"]]


@pytest.fixture
def exported(transactional_db, settings) -> set[str]:
    """Every sample name a real scrape of PILOT reports (after a dispatcher pass,
    so the liveness gauge exists), with the histogram and counter suffixes."""
    from django.core.cache import cache

    from workflows.engine.loop import dispatcher_loop
    from workflows.observability import metrics

    settings.PILOT_METRICS_TASKS_TTL = 0
    metrics._last_beat = 0.0
    cache.delete(metrics._DISPATCHER_KEY)
    dispatcher_loop(threading.Event(), poll=0.01, max_passes=1)
    text = Client().get("/metrics").content.decode()
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                    "gauge": [""]}.get(kind, [""])
        names.update(name if name.endswith(s) else name + s for s in suffixes)
    return names


def test_the_alert_rules_cover_what_an_operator_must_be_woken_for():
    by_name = {rule["alert"]: rule for rule in rules()}
    assert {"PilotDispatcherDown", "PilotBacklogOld", "PilotBacklogAtCap", "PilotFailureRateHigh",
            "PilotLeaseRecoveries"} <= set(by_name)
    for rule in by_name.values():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert isinstance(rule["expr"], str) and rule["expr"].strip()


CONSOLE_BASE = "{{ $externalLabels.pilot_console_url }}"
DOCS_BASE = "{{ $externalLabels.pilot_docs_url }}"


@pytest.mark.django_db
def test_every_alert_links_to_a_console_view_that_exists_and_to_its_runbook(
        admin_client):
    """Each alert's `dashboard` is a console page (a filter the list accepts,
    or a page that answers) under the configurable base, and its
    `runbook_url` the section of docs/operations.md that explains the links."""
    from urllib.parse import urlsplit

    from django.http import QueryDict

    from workflows.admin.list_params import list_params_check

    operations = (ROOT / "docs" / "operations.md").read_text()
    for rule in rules():
        notes = rule["annotations"]
        assert notes["dashboard"].startswith(CONSOLE_BASE + "/admin/"), rule["alert"]
        link = urlsplit(notes["dashboard"][len(CONSOLE_BASE):])
        _, problems = list_params_check(QueryDict(link.query))
        assert not problems, (rule["alert"], problems)
        assert admin_client.get(f"{link.path}?{link.query}").status_code == 200, rule["alert"]
        if link.fragment:
            page = admin_client.get(link.path).content.decode()
            assert f'id="{link.fragment}"' in page, rule["alert"]
        doc, _, anchor = notes["runbook_url"][len(DOCS_BASE) + 1:].partition("#")
        assert notes["runbook_url"].startswith(DOCS_BASE + "/") and doc == "operations.md"
        assert "## " + anchor.replace("-", " ").capitalize() in operations, anchor


def test_the_dashboard_is_a_well_formed_grafana_dashboard():
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 30
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    cells = set()
    for panel in board["panels"]:
        assert panel["type"] in ("stat", "timeseries")
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"panel {panel['id']} overlaps another"
        cells |= mine


def test_every_metric_named_is_one_pilot_exports(exported):
    named = set()
    for expr in [rule["expr"] for rule in rules()] + dashboard_exprs():
        named |= metric_names(expr)
    assert named - exported == set()
    assert {"pilot_dispatcher_last_pass_age_seconds", "pilot_backlog_tasks",
            "pilot_oldest_pending_age_seconds", "pilot_clients_at_cap"} <= exported


def test_promtool_loads_the_rules_runs_their_tests_and_parses_the_dashboard(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package `prometheus`; `make test` "
                    "installs it): the rules and dashboard were checked structurally only")
    for args in (["check", "rules", RULES], ["test", "rules", RULES_TESTS]):
        done = subprocess.run([promtool, *map(str, args)], capture_output=True, text=True,
                              timeout=60, cwd=RULES.parent)
        assert done.returncode == 0, done.stdout + done.stderr
    # The dashboard's queries, as recording rules: promtool parses each one.
    recorded = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"pilot:dashboard_query_{n}", "expr": expr}
        for n, expr in enumerate(dashboard_exprs())]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(recorded))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
