"""Every shell and python block of README.md and docs/*.md is verified
(tests/docs/blocks.py, docs/testing.md "Every doc block runs"): each carries a
marker; a `pilot:run` block runs here as written and must succeed; a
`pilot:checked-by` one names a test that reads its page; a `pilot:not-run` one
says why. A broken block, or one with no marker, fails."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from django.conf import settings

from tests.docs.blocks import PAGES, ROOT, Block, all_blocks, blocks, marker_problems
from tests.docs.conftest import developer_env
from workflows.registry import registry

RUN = [b for b in all_blocks() if b.kind == "run"]


def on_postgres() -> bool:
    return settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def as_against(script: str, server) -> str:
    """The reader's one edit (pasting the token make run printed) and this run's port."""
    script = re.sub(r"^TOKEN=\S+$", f"TOKEN={server.token}", script, flags=re.M)
    return script.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}")


def run_process(block: Block, request) -> subprocess.CompletedProcess:
    """A shell block with bash -e, or a python `server` block with this Python, in
    the project directory. One that calls manage.py finds make run's database, as
    in a second terminal beside it; a `server` one talks to the session's make run."""
    options = block.run_options()
    env = {**developer_env(venv=options["venv"]), **options["env"]}
    script = block.script()
    if "manage.py" in script or options["server"]:
        env["DATABASE_URL"] = request.getfixturevalue("make_run_database")
    if options["server"]:
        server = request.getfixturevalue("make_run_server")
        env.update({"PILOT_URL": server.url, "PILOT_TOKEN": server.token})
        script = as_against(script, server)
    args = [sys.executable, "-c", script] if block.language == "python" else \
        ["bash", "-e", "-c", script]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def run_python(block: Block, capsys) -> str:
    """The block in this process (the test database), as a module of its own;
    the workflows it registers are unregistered after it."""
    before = set(registry._workflows)
    try:
        exec(compile(block.code, f"{block.page.name}:{block.line}", "exec"),
             {"__name__": f"doc_block_{block.line}"})
    finally:
        for name in set(registry._workflows) - before:
            registry.unregister(name)
    return capsys.readouterr().out


def check(block: Block, request, capsys) -> None:
    """Run `block` as its marker says; an AssertionError says what went wrong."""
    options = block.run_options()
    if block.language == "python" and not options["server"]:
        assert options["env"] == {} and options["expect_exit"] == {0}, \
            f"{block.id}: env and expect-exit are for blocks run as processes"
        out = run_python(block, capsys)
    else:
        done = run_process(block, request)
        assert done.returncode in options["expect_exit"], (
            f"{block.id} exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
            f"\n--- stderr\n{done.stderr[-3000:]}")
        out = done.stdout
    for expected in options["stdout"]:
        assert expected in out, f"{block.id}: {expected!r} not in its output:\n{out[-3000:]}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_of_the_page_has_a_valid_marker(page):
    assert [problem for block in blocks(page) for problem in marker_problems(block)] == []


@pytest.mark.django_db
@pytest.mark.parametrize("block", RUN, ids=lambda b: b.id)
def test_the_block_runs_as_written(block, request, capsys):
    if (block.language != "python" or block.run_options()["server"]) and on_postgres():
        pytest.skip("make run is SQLite whatever the suite's database: once, in the SQLite "
                    "pass")
    check(block, request, capsys)


# --- the mechanism can fail ----------------------------------------------------------

BROKEN = """# A page

<!-- pilot:run stdout=hello -->
```sh
echo hello
```

<!-- pilot:run -->
```console
$ echo one
$ false
```

<!-- pilot:run -->
```python
from workflows.sdk import define_workflow
define_workflow("meta.x")
raise RuntimeError("broken")
```

```python
print("no marker")
```

<!-- pilot:not-run -->
```sh
rm -rf /
```

<!-- pilot:checked-by tests/docs/test_links.py::test_nothing_here -->
```sh
make run
```

<!-- pilot:run expect-exit=3 flavour=x -->
```sh
exit 3
```

<!-- pilot:run server stdout='"results":[' -->
```sh
TOKEN=pilot_paste_yours_here
curl -sf http://127.0.0.1:8000/api/v1/tasks -H "Authorization: Token $TOKEN"
```
"""


@pytest.mark.django_db
def test_a_broken_block_fails_and_an_unmarked_one_is_found(tmp_path, request, capsys):
    page = tmp_path / "page.md"
    page.write_text(BROKEN)
    ok, failing_shell, failing_python, unmarked, no_reason, wrong_test, bad_option, _ = \
        blocks(page)
    check(ok, request, capsys)
    with pytest.raises(AssertionError, match=r"page\.md:9 exited 1"):
        check(failing_shell, request, capsys)
    with pytest.raises(RuntimeError, match="broken"):
        check(failing_python, request, capsys)
    assert registry.find("meta.x") is None  # cleaned up even so
    assert [marker_problems(b) for b in (unmarked, no_reason, wrong_test, bad_option)] == [
        ["page.md:21: a python block with no pilot:run, pilot:checked-by or pilot:not-run "
         "marker before it"],
        ["page.md:26: pilot:not-run must say why"],
        ["page.md:31: checked-by tests/docs/test_links.py::test_nothing_here: no such test"],
        ["page.md:36: unknown option 'flavour'"],
    ]
    ok.options = "stdout=goodbye"
    with pytest.raises(AssertionError, match="'goodbye' not in its output"):
        check(ok, request, capsys)


@pytest.mark.django_db
def test_a_server_block_gets_make_runs_token_and_port_and_fails_without(
        tmp_path, request, capsys):
    if on_postgres():
        pytest.skip("make run is SQLite whatever the suite's database: once, in the SQLite "
                    "pass")
    page = tmp_path / "page.md"
    page.write_text(BROKEN)
    against_make_run = blocks(page)[-1]
    check(against_make_run, request, capsys)  # the pasted token and the port: 200
    against_make_run.options = against_make_run.options.replace("server ", "")
    # Without it, curl meets nothing on port 8000 (7), or a server that refuses the
    # unpasted token (22): the block fails either way.
    with pytest.raises(AssertionError, match=r"exited (7|22)\b"):
        check(against_make_run, request, capsys)
