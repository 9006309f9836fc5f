"""Every relative link and #anchor in README.md, docs/*.md and bench/results.md
resolves: the file (or folder) exists, and the anchor is a heading of that page
as GitHub renders it. Fast (no network, no database): part of the default run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.procs import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "results.md"]

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", flags=re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", flags=re.S)
# [text](target) and ![alt](target); the text may hold brackets one level deep.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", flags=re.M)


def prose(markdown: str) -> str:
    """The page without its code blocks and code spans (links there are examples)."""
    return CODE_SPAN.sub("", FENCE.sub("", markdown))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation other
    than '-' and '_' dropped, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def broken_links(page: Path) -> list[str]:
    problems = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):
            continue  # http:, https:, mailto: — not checked here (no network)
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading with anchor #{anchor}")
        elif anchor and resolved.suffix != ".md":
            problems.append(f"{target}: an anchor into a file that is not Markdown")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


# A test path a page names (`tests/engine/test_caps.py`, `…/test_x.py::test_y`), in
# prose or in code: the tests move (docs/testing.md, "Where tests live").
TEST_PATH = re.compile(r"(?<![\w/.-])(tests/[\w/.-]*\w)(?:::(\w+))?")


def missing_test_paths(text: str) -> list[str]:
    problems = []
    for path, name in TEST_PATH.findall(text):
        if not (ROOT / path).exists():
            problems.append(f"{path}: no such file or folder")
        elif name and not re.search(rf"^\s*(?:async )?def {name}\(", (ROOT / path).read_text(),
                                    flags=re.M):
            problems.append(f"{path}::{name}: no such test")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_test_path_a_page_names_exists(page):
    assert missing_test_paths(page.read_text()) == []


def test_the_path_checker_finds_a_moved_file_and_a_renamed_test():
    text = ("`tests/docs/test_links.py::test_the_readme_stays_short`, tests/engine/store/ "
            "and `tests/…` are there; `tests/engine/test_fencing.py` moved, "
            "`tests/docs/test_links.py::test_gone` never was.")
    assert missing_test_paths(text) == [
        "tests/engine/test_fencing.py: no such file or folder",
        "tests/docs/test_links.py::test_gone: no such test",
    ]


def test_the_readme_stays_short():
    """Issue 13: a newcomer reads it in two minutes; everything else lives in docs/."""
    assert len((ROOT / "README.md").read_text()) <= 8000


def test_the_checker_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    (tmp_path / "other.md").write_text(
        "# Other\n\n## Set-up: `make run`, twice\n\n## Set-up: `make run`, twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Its own part\n\n"
        "[ok](other.md#set-up-make-run-twice) [ok too](other.md#set-up-make-run-twice-1) "
        "[self](#its-own-part) [web](https://example.com/x#y) `[in code](nowhere.md)`\n\n"
        "```\n[in a block](nowhere.md)\n```\n\n"
        "[gone](missing.md) [no anchor](other.md#setup) [nor here](#nothing) "
        "![picture](img/none.png)\n")
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#setup: no heading with anchor #setup",
        "#nothing: no heading with anchor #nothing",
        "img/none.png: no such file",
    ]


CITATION = re.compile(r'docs/design\.md,(?:\s|#)*"([^"]+)"')


def design_sections() -> set[str]:
    return {h.strip("`") for h in HEADING.findall(FENCE.sub("", (ROOT / "docs" / "design.md")
                                                             .read_text()))}


def code_files() -> list[Path]:
    return sorted(p for top in ("workflows", "pilot") for p in (ROOT / top).rglob("*")
                  if p.suffix in (".py", ".html", ".sql", ".js", ".css") and p.is_file())


def test_every_citation_of_the_design_names_one_of_its_sections():
    sections = design_sections()
    cited = {(str(path.relative_to(ROOT)), " ".join(name.replace("#", " ").split()))
             for path in code_files()
             for name in CITATION.findall(path.read_text(errors="replace"))}
    assert len(cited) > 20  # the code does cite it
    assert sorted((path, name) for path, name in cited if name not in sections) == []


def test_the_code_cites_no_document_outside_the_repository():
    """Issue 13 item 5: the design lives in docs/design.md; no "SPEC §n" or
    "STYLE practice n" pointing at documents the repository does not hold."""
    outside = re.compile(r"\bSPEC\b|STYLE")
    assert [f"{path.relative_to(ROOT)}:{n}" for path in code_files()
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
            if outside.search(line)] == []
