"""The code blocks of README.md and docs/*.md, and how each one is verified.

Every ```sh, ```console and ```python block carries a marker, an HTML comment on
the line before its fence (docs/testing.md, "Every doc block runs"):

- `<!-- pilot:run [options] -->` — tests/docs/test_blocks.py runs it as written:
  a shell block (a ```console block's `$ ` lines) with bash -e in the project
  directory, in a developer's environment (none of the suite's variables) with
  `make run`'s kind of database (a migrated SQLite file of the session); a python
  block in this process against the test database. Options: `env=NAME=value`
  (may repeat: what the doc tells the reader to set), `expect-exit=0,124` (the
  exit codes that mean it worked; 0 by default), `stdout="TEXT"` (may repeat: text
  the output must hold), `venv=active` (the reader's virtualenv is active, so
  `python` is the project's: embedding.md's own project; otherwise `python` on
  PATH is the system's, as in a new terminal), `server` (it talks to `make run`:
  one real make run of the session — the reader's pasted `TOKEN=` line gets its
  token, `127.0.0.1:8000` its port, and PILOT_URL / PILOT_TOKEN are set; a python
  block then runs as its own process).
- `<!-- pilot:checked-by tests/…/test_x.py[::test_name] -->` — a test of its own
  runs it and asserts more than an exit code (it reads this page).
- `<!-- pilot:not-run: why -->` — it cannot run here (a production deploy, a
  network install, something destructive); the reason is the review.

A block with no marker fails test_blocks.py: no block is silently unverified.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"sh", "console", "python"}

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", flags=re.S | re.M)
MARKER = re.compile(r"<!--\s*pilot:(run|checked-by|not-run)\b:?\s*(.*?)\s*-->", flags=re.S)


class MarkerError(ValueError):
    pass


@dataclasses.dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    kind: str | None  # "run", "checked-by", "not-run", or None: no marker
    options: str

    @property
    def id(self) -> str:
        return f"{self.page.name}:{self.line}"

    def script(self) -> str:
        """What runs: a console block's `$ ` commands (other lines are their output)."""
        if self.language != "console":
            return self.code
        return "".join(line[2:] + "\n" for line in self.code.splitlines()
                       if line.startswith("$ "))

    def run_options(self) -> dict:
        """The `pilot:run` options: {"env": {...}, "expect_exit": {...}, "stdout": [...]}."""
        found: dict = {"env": {}, "expect_exit": {0}, "stdout": [], "venv": False,
                       "server": False}
        for word in shlex.split(self.options):
            name, eq, value = word.partition("=")
            if word == "server":
                found["server"] = True
                continue
            if not eq:
                raise MarkerError(f"{self.id}: option {word!r} has no value")
            if name == "env":
                var, eq, setting = value.partition("=")
                if not eq or not re.fullmatch(r"[A-Z][A-Z0-9_]*", var):
                    raise MarkerError(f"{self.id}: env={value!r} is not NAME=value")
                found["env"][var] = setting
            elif name == "expect-exit":
                found["expect_exit"] = {int(code) for code in value.split(",")}
            elif name == "venv" and value == "active":
                found["venv"] = True
            elif name == "stdout":
                found["stdout"].append(value)
            else:
                raise MarkerError(f"{self.id}: unknown option {name!r}")
        return found


def blocks(page: Path) -> list[Block]:
    """Every shell and python block of `page`, with the marker before it (if any)."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        language = match.group(1)
        if language not in LANGUAGES:
            continue
        before = text[:match.start()].rstrip()
        # The comment that ends right before the fence (it may span lines).
        marker = (MARKER.fullmatch(before[before.rfind("<!--"):])
                  if before.endswith("-->") else None)
        found.append(Block(page=page, line=text.count("\n", 0, match.start()) + 1,
                           language=language, code=match.group(2),
                           kind=marker.group(1) if marker else None,
                           options=marker.group(2) if marker else ""))
    return found


def marker_problems(block: Block) -> list[str]:
    """What is wrong with a block's marker: [] when it has a valid one."""
    if block.kind is None:
        return [f"{block.id}: a {block.language} block with no pilot:run, pilot:checked-by "
                "or pilot:not-run marker before it"]
    if block.kind == "not-run" and len(block.options) < 10:
        return [f"{block.id}: pilot:not-run must say why"]
    if block.kind == "checked-by":
        path, _, name = block.options.partition("::")
        test = ROOT / path
        if not path.startswith("tests/") or not test.is_file():
            return [f"{block.id}: checked-by {path!r}: no such test file"]
        source = test.read_text()
        if name and not re.search(rf"^\s*def {name}\(", source, flags=re.M):
            return [f"{block.id}: checked-by {block.options}: no such test"]
        if block.page.name not in source:
            return [f"{block.id}: {path} never reads {block.page.name}"]
    if block.kind == "run":
        try:
            block.run_options()
        except (MarkerError, ValueError) as exc:
            return [str(exc)]
    return []


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def checked_by(page: Path, test: str) -> list[str]:
    """The code of the blocks of `page` whose `pilot:checked-by` names `test` (a
    test function's name), in page order: a page test finds its blocks by the
    marker that promises it runs them, so removing either breaks the test."""
    return [block.code for block in blocks(page) if block.kind == "checked-by"
            and block.options.partition("::")[2] == test]
