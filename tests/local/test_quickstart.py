"""The README's quickstart, run as written against `make run`'s own processes,
twice in a row (issue 13: a newcomer's first minute must work): the only edit is
the one the README asks for — pasting the token `make run` printed — plus the
port of this test's run. Then docs/api.md's walkthrough, which goes on in the
same shell, and the console page the quickstart sends the reader to."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar

import pytest

from tests.local.conftest import _TEST_ONLY, skip_on_postgres
from tests.support.procs import ROOT

pytestmark = [pytest.mark.slow, skip_on_postgres]


def sh_blocks(page: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```$", (ROOT / page).read_text(), flags=re.S | re.M)


def quickstart() -> str:
    [block] = [b for b in sh_blocks("README.md") if b.startswith("TOKEN=")]
    return block


def walkthrough() -> str:
    [block] = [b for b in sh_blocks("docs/api.md") if b.startswith("# 5.")]
    return block


def as_run(script: str, run) -> str:
    """The script with the reader's one edit (their token) and this run's port."""
    script, pasted = re.subn(r"^TOKEN=\S+$", f"TOKEN={run.token}", script, flags=re.M)
    assert pasted == 1
    return script.replace("127.0.0.1:8000", f"127.0.0.1:{run.port}")


def bash(script: str, run) -> str:
    """Run it as the reader's second terminal would: the project directory, a
    developer's environment (manage.py there finds make run's database)."""
    env = {k: v for k, v in os.environ.items() if k not in _TEST_ONLY}
    env["DATABASE_URL"] = f"sqlite:///{run.database}"
    done = subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def replies(output: str) -> list[dict]:
    """Every JSON object the script printed, each on its own line."""
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def finished(run, task: dict, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while task["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"task still {task['state']}"
        time.sleep(0.2)
        request = urllib.request.Request(f"{run.url}/api/v1/tasks/{task['id']}",
                                         headers={"Authorization": f"Token {run.token}"})
        with urllib.request.urlopen(request) as response:
            task = json.loads(response.read())
    return task


def console_page(run, path: str) -> str:
    """`path` as the admin sees it, logged in with the password make run printed."""
    password = re.search(r"user admin\s+password (\S+)", run.log()).group(1)
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    login = f"{run.url}/admin/login/"
    opener.open(login).read()
    csrf = next(c.value for c in jar if c.name == "csrftoken")
    form = urllib.parse.urlencode({"csrfmiddlewaretoken": csrf, "username": "admin",
                                   "password": password, "next": "/admin/"}).encode()
    opener.open(urllib.request.Request(login, data=form, headers={"Referer": login})).read()
    with opener.open(f"{run.url}{path}") as response:
        assert response.url.endswith(path)  # not sent back to the login page
        return response.read().decode()


def test_the_readme_quickstart_works_verbatim_twice_then_the_api_walkthrough(local_run):
    run = local_run()
    tasks = []
    for _ in range(2):
        out = bash(as_run(quickstart(), run), run)
        assert re.search(r"^HTTP/1.1 202 Accepted", out, flags=re.M)
        assert re.search(r"^HTTP/1.1 200 OK", out, flags=re.M)
        assert re.search(r"^Idempotent-Replayed: true", out, flags=re.M | re.I)
        created, replayed, read = replies(out)  # one reply per line, none glued
        assert created["id"] == replayed["id"] == read["id"]
        assert (created["state"], replayed["replays"]) == ("pending", 1)
        # A second after the trigger it has run, unless this machine is very busy:
        # then the reader would see it a moment later, as this does.
        read = finished(run, read)
        assert (read["state"], read["result"]) == ("succeeded", {"written": 100})
        assert [s["name"] for s in read["steps"]] == ["fetch", "transform", "write"]
        link = out.strip().splitlines()[-1]
        assert link == f"{run.url}/admin/workflows/task/{read['id']}/change/"
        tasks.append(read["id"])
    assert tasks[0] != tasks[1]  # the second run made its own key, its own task

    page = console_page(run, f"/admin/workflows/task/{tasks[1]}/change/")
    assert tasks[1] in page and "Replays" in page

    out = bash(as_run(quickstart(), run) + "\n" + walkthrough(), run)
    foreign, cancelling, cancelled, retried, reused = replies(out)[3:]
    assert foreign["code"] == "not_found"
    assert cancelling["state"] in ("cancelling", "cancelled")
    assert cancelled["state"] == "cancelled"
    assert retried["state"] == "pending"
    assert reused["code"] == "idempotency_key_reused"
