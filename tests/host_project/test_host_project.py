"""PILOT inside a host project, the way a Django team adopts it (docs/embedding.md).

The built wheel is installed into a throwaway virtualenv with nothing of this
repository on the import path; tests/host_project/ (its own settings, urls, a
shop app with its own workflow, DRF defaults unlike PILOT's, the API under
/pilot/api/, PILOT's cluster as an ALT_CLUSTERS entry) is copied next to it.
Then, as the page says: `check`, `migrate`, `create_api_client`, a trigger over
HTTP, `run_workers` runs it, and the admin shows it.

On the database the suite runs on: a SQLite file (ORM broker), or a database
of its own next to the suite's PostgreSQL one (and Redis as broker and cache
when REDIS_URL is set).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import django
import httpx
import pytest

from tests.support.procs import ROOT, free_port, log_file, wait_until

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def run(args, *, cwd, env, timeout=240) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def host_venv(tmp_path_factory) -> Path:
    """A virtualenv with the wheel built from this checkout and its
    dependencies (the versions requirements.txt pins, as constraints)."""
    tmp = tmp_path_factory.mktemp("host-venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # setuptools builds in ROOT/build and never removes a file the tree lost
    # since the last build (a renamed migration would ship twice): start clean.
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp / "dist", ROOT],
        cwd=tmp, env=env)
    [wheel] = (tmp / "dist").glob("pilot_workflows-*.whl")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=tmp, env=env)
    extras = ["psycopg[binary]"] if os.environ.get("DATABASE_URL", "").startswith("postgres") \
        else []
    # requirements.txt as constraints (pip refuses extras there); in the Django 6 pass
    # (make test-django6) with requirements-django6.txt's pins in place of its own, so
    # the host gets the Django this suite runs on.
    constraints = tmp / "constraints.txt"
    constraints.write_text(re.sub(r"\[[^\]]*\]", "", _constraints()))
    # [tasks]: the django-tasks backport, Django 5.2's task framework (docs/django-tasks.md).
    run([venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check",
         "-c", constraints, f"{wheel}[tasks]", *extras], cwd=tmp, env=env, timeout=480)
    # The wheel accepts the Django the suite runs on (5.2 or 6.x): pip kept it, no
    # downgrade (issue 30, F17: a `<6.0` cap once swapped a host's 6.1 for 5.2).
    host_django = run([venv / "bin" / "python", "-c", "import django; print(django.__version__)"],
                      cwd=tmp, env=env).strip()
    assert host_django == django.__version__
    return venv


def _constraints() -> str:
    pins = (ROOT / "requirements.txt").read_text()
    if django.VERSION < (6,):
        return pins
    override = (ROOT / "requirements-django6.txt").read_text()
    names = {re.split(r"[=\[]", line)[0].lower() for line in override.splitlines()
             if re.match(r"[A-Za-z]", line)}
    kept = [line for line in pins.splitlines()
            if not (re.match(r"[A-Za-z]", line) and re.split(r"[=\[]", line)[0].lower() in names)]
    return "\n".join([*kept, override])


@pytest.fixture
def host(host_venv, tmp_path):
    """The host project copied out of the repository, its database, and its env."""
    project = tmp_path / "hostsite"
    shutil.copytree(HERE, project, ignore=shutil.ignore_patterns("test_*.py", "__pycache__"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL")
           and not k.startswith("PILOT_")}
    env.update(PATH=f"{host_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PYTHONUNBUFFERED="1")
    database = os.environ.get("DATABASE_URL", "")
    if database.startswith("postgres"):
        env["HOST_DB"] = _fresh_postgres_database(database)
        if os.environ.get("REDIS_URL"):
            env["HOST_REDIS_URL"] = os.environ["REDIS_URL"]
    else:
        env["HOST_DB"] = str(tmp_path / "host.sqlite3")
    return project, host_venv / "bin" / "python", env


def _fresh_postgres_database(url: str) -> str:
    import psycopg

    parts = urllib.parse.urlsplit(url)
    name = f"{parts.path.lstrip('/')}_host"
    # Through the maintenance database, as Django's test runner does: the database
    # DATABASE_URL names need not exist (a fresh CI machine has only `postgres`).
    maintenance = urllib.parse.urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


class Server:
    def __init__(self, python, project, env, name, args):
        self.log_path = log_file(f"host-{name}")
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        self.popen = subprocess.Popen([str(python), "manage.py", *args], cwd=project, env=env,
                                      stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        log.close()

    def stop(self):
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, 15)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, 9)
                self.popen.wait(5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def test_the_wheel_runs_inside_a_host_project(host):
    project, python, env = host
    manage = [python, "manage.py"]

    # The app comes from the wheel, not from this checkout.
    where = run([python, "-c", "import workflows; print(workflows.__file__)"],
                cwd=project, env=env)
    assert "site-packages" in where and str(ROOT) not in where

    # Step 7: check passes with no PILOT warning (every optional piece is in place,
    # and PILOT's cluster requirements hold on its ALT_CLUSTERS entry only).
    checked = run([*manage, "check"], cwd=project, env=env)
    assert "pilot." not in checked, checked
    run([*manage, "migrate", "--noinput"], cwd=project, env=env)
    created = run([*manage, "create_api_client", "shop-backend"], cwd=project, env=env)
    token = re.search(r"token (pilot_\S+)", created).group(1)
    run([*manage, "shell", "-c",
         "from django.contrib.auth.models import User; "
         "User.objects.create_superuser('boss', 'boss@example.com', 'pw-boss-0123456789')"],
        cwd=project, env=env)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    web = Server(python, project, env, "web", ["runserver", "--noreload", "--nothreading",
                                               f"127.0.0.1:{port}"])
    workers = None
    try:
        wait_until(lambda: _answers(f"{base}/ops/healthz"), 60, what="the host's runserver")
        api = httpx.Client(base_url=base, headers={"Authorization": f"Token {token}"},
                           timeout=10)

        # A trigger over HTTP, with PILOT's answers whatever the host's DRF defaults.
        r = api.post("/pilot/api/tasks", headers={"Idempotency-Key": "order-1"},
                     json={"workflow": "shop.receipt",
                           "payload": {"email": "a@example.com",
                                       "items": [{"price": 3}, {"price": 4}]}})
        assert r.status_code == 202, r.text
        task_id = r.json()["id"]
        assert r.headers["Location"] == f"/pilot/api/tasks/{task_id}"
        assert re.fullmatch(r"[\x21-\x7e]{1,64}", r.headers["X-Request-ID"])
        assert api.post("/pilot/api/tasks", headers={"Idempotency-Key": "order-1"},
                        json={"workflow": "shop.receipt",
                              "payload": {"email": "a@example.com",
                                          "items": [{"price": 3}, {"price": 4}]}}
                        ).headers["Idempotent-Replayed"] == "true"

        # Errors are problem+json, not the host's HTML or DRF's default body.
        unknown = api.post("/pilot/api/tasks", headers={"Idempotency-Key": "x"},
                           json={"workflow": "no.such", "payload": {}})
        assert (unknown.status_code, unknown.headers["Content-Type"]) == \
            (400, "application/problem+json")
        assert unknown.json()["code"] == "unknown_workflow"
        big = api.post("/pilot/api/tasks", headers={"Idempotency-Key": "big"},
                       json={"workflow": "shop.receipt", "payload": {"pad": "x" * 8000}})
        assert (big.status_code, big.json()["code"]) == (413, "payload_too_large")
        anonymous = httpx.get(f"{base}/pilot/api/tasks")
        assert (anonymous.status_code, anonymous.json()["code"]) == (401, "not_authenticated")

        # The host's own API keeps the host's defaults (Basic auth, admins only).
        assert httpx.get(f"{base}/api/ping", headers={"Accept": "application/json"}
                         ).status_code in (401, 403)
        pong = httpx.get(f"{base}/api/ping", auth=("boss", "pw-boss-0123456789"),
                         headers={"Accept": "application/json"})
        assert pong.json() == {"pong": True, "user": "boss"}

        # The schema describes PILOT's routes where the host mounted them.
        schema = api.get("/pilot/api/schema", params={"format": "json"}).json()
        assert "/pilot/api/tasks" in schema["paths"]
        assert "/api/ping" not in schema["paths"]
        assert all(p.startswith(("/pilot/api/", "/ops/")) for p in schema["paths"])

        # Step 8: run_workers starts PILOT's cluster (the ALT_CLUSTERS entry) and runs it.
        workers = Server(python, project, env, "workers", ["run_workers"])
        done = wait_until(lambda: _finished(api, task_id), 90, interval=0.3,
                          what="the task to finish")
        assert done["state"] == "succeeded", done
        assert done["result"] == {"sent_to": "a@example.com", "total": 7}

        # A Django task (docs/django-tasks.md): enqueued from the host's own code,
        # twice — one PILOT task — run by the same workers, read back through the
        # framework and seen by its owner's API client.
        enqueue = ("from shop.tasks import ship; "
                   "print('id', ship.enqueue(7, address='Main St 1').id)")
        ids = [re.search(r"^id (\S+)$", run([*manage, "shell", "-c", enqueue], cwd=project,
                                             env=env), re.M).group(1) for _ in range(2)]
        assert ids[0] == ids[1]
        shipped = wait_until(lambda: _finished(api, ids[0]), 90, interval=0.3,
                             what="the Django task to finish")
        assert (shipped["workflow"], shipped["state"], shipped["result"]) == \
            ("shop.tasks.ship", "succeeded", {"order": 7, "shipped_to": "Main St 1"})
        read = run([*manage, "shell", "-c",
                    f"from shop.tasks import ship; r = ship.get_result({ids[0]!r}); "
                    "print('status', r.status, r.return_value)"], cwd=project, env=env)
        assert "status SUCCESSFUL {'order': 7, 'shipped_to': 'Main St 1'}" in read, read

        # Step 9: the admin shows it (a session login through the guarded form).
        browser = httpx.Client(base_url=base, timeout=10)
        login = browser.get("/admin/login/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
        logged_in = browser.post("/admin/login/?next=/admin/", data={
            "csrfmiddlewaretoken": csrf, "username": "boss", "password": "pw-boss-0123456789",
            "next": "/admin/"}, headers={"Referer": f"{base}/admin/login/"})
        assert logged_in.status_code == 302, logged_in.text[:500]
        page = browser.get(f"/admin/workflows/task/{task_id}/change/")
        assert page.status_code == 200
        assert "shop.receipt" in page.text and "succeeded" in page.text
        home = browser.get("/admin/")
        assert "Django administration" in home.text  # the host's admin keeps its name
        assert "PILOT operator console" not in home.text
        assert browser.get("/admin/workflows/task/").status_code == 200

        # Probes answer by IP too (ProbeMiddleware), at the host's paths.
        ready = httpx.get(f"{base}/ops/readyz", headers={"Host": "10.1.2.3:8000"})
        assert ready.status_code == 200 and ready.json()["checks"]["database"] is True
    except BaseException:
        for server in (web, workers):
            if server is not None:
                sys.stderr.write(server.log()[-4000:])
        raise
    finally:
        for server in (workers, web):
            if server is not None:
                server.stop()

    # Uninstalling: the operators group PILOT created goes with it.
    run([*manage, "migrate", "workflows", "zero", "--noinput"], cwd=project, env=env)
    left = run([*manage, "shell", "-c", "from django.contrib.auth.models import Group; "
                "print('groups:', list(Group.objects.values_list('name', flat=True)))"],
               cwd=project, env=env)
    assert "groups: []" in left, left


def test_a_host_with_email_logins_its_own_operators_group_and_the_api_deeper(host):
    """A host whose user model has no `username` (USERNAME_FIELD = "email"),
    which had an `operators` group before PILOT, and mounts the API at
    /tools/pilot/api/: every account PILOT makes works (API client, CLI and
    scheduler owners), pilot-client reaches the API there, and
    `migrate workflows zero` leaves the host's group as it was."""
    from pilot_client import PilotClient

    project, python, env = host
    env = {**env, "DJANGO_SETTINGS_MODULE": "hostsite.settings_people"}
    manage = [python, "manage.py"]

    def shell(code: str) -> str:
        return run([*manage, "shell", "-c", code], cwd=project, env=env)

    run([*manage, "migrate", "people", "--noinput"], cwd=project, env=env)
    shell("from django.contrib.auth.models import Group, Permission; "
          "from people.models import User; "
          "g = Group.objects.create(name='operators'); "
          "g.permissions.add(Permission.objects.get(codename='change_user')); "
          "User.objects.create_user('ops@shop.example').groups.add(g)")
    run([*manage, "migrate", "--noinput"], cwd=project, env=env)
    token = re.search(r"token (pilot_\S+)",
                      run([*manage, "create_api_client", "shop-backend"], cwd=project,
                          env=env)).group(1)
    cli = run([*manage, "trigger_workflow", "shop.receipt", "--key", "cli-1", "--payload",
               '{"email": "a@example.com", "items": [{"price": 2}]}'], cwd=project, env=env)
    assert "owner cli" in cli, cli
    assert "owner: scheduler" in shell(
        "from workflows.accounts import scheduler_owner_get; "
        "print('owner:', scheduler_owner_get().get_username())")

    port = free_port()
    web = Server(python, project, env, "web-people",
                 ["runserver", "--noreload", "--nothreading", f"127.0.0.1:{port}"])
    try:
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/ops/healthz"), 60,
                   what="the host's runserver")
        with PilotClient(f"http://127.0.0.1:{port}/tools/pilot/api", token) as pilot:
            run_ = pilot.trigger("shop.receipt", {"email": "b@example.com",
                                                  "items": [{"price": 5}]}, key="order-1")
            assert (run_.status, run_.task.workflow) == (202, "shop.receipt")
            assert pilot.get(run_.task_id).idempotency_key == "order-1"
    except BaseException:
        sys.stderr.write(web.log()[-4000:])
        raise
    finally:
        web.stop()

    run([*manage, "migrate", "workflows", "zero", "--noinput"], cwd=project, env=env)
    kept = shell("import json; from django.contrib.auth.models import Group; "
                 "g = Group.objects.get(name='operators'); "
                 "print('kept:', json.dumps(["
                 "list(g.permissions.values_list('codename', flat=True)), "
                 "list(g.user_set.values_list('email', flat=True))]))")
    assert json.loads(re.search(r"kept: (.*)", kept).group(1)) == \
        [["change_user"], ["ops@shop.example"]]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _finished(api, task_id):
    body = api.get(f"/pilot/api/tasks/{task_id}").json()
    return body if body["state"] in ("succeeded", "failed", "cancelled") else None


def test_the_host_projects_default_cluster_keeps_django_q2s_defaults(host):
    """PILOT's checks judge its own ALT_CLUSTERS entry: the host's cluster may
    retry forever, and a broken PILOT entry is named in the error."""
    project, python, env = host
    script = (
        "import json, django; django.setup(); "
        "from django.test import override_settings; from django.conf import settings; "
        "from workflows.checks import pilot_execution_settings as c; "
        "ok = [e.id for e in c(None)]; "
        "q = {**settings.Q_CLUSTER, 'ALT_CLUSTERS': "
        "{settings.PILOT_Q_CLUSTER_NAME: {'timeout': 300, 'retry': 60}}}; "
        "bad = override_settings(Q_CLUSTER=q); bad.enable(); "
        "broken = [e.id for e in c(None)]; bad.disable(); "
        "q = {k: v for k, v in settings.Q_CLUSTER.items() if k != 'ALT_CLUSTERS'}; "
        "gone = override_settings(Q_CLUSTER=q); gone.enable(); "
        "missing = [e.id for e in c(None)]; "
        "print(json.dumps([ok, broken, missing]))")
    out = run([python, "-c", script], cwd=project,
              env={**env, "DJANGO_SETTINGS_MODULE": "hostsite.settings",
                   "PYTHONPATH": str(project)})
    ok, broken, missing = json.loads(out.strip().splitlines()[-1])
    assert ok == []
    assert broken == ["pilot.E002", "pilot.E003", "pilot.E008", "pilot.W008"]
    assert missing == ["pilot.E005"]
