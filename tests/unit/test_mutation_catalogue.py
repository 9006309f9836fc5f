"""The mutation check's catalogue (tests/mutations/run.py) stays true to the tree,
on every run of the suite — the check itself runs its CI subset in `make test`
and everything in `make mutate`:

- every mutant's text is found exactly once in today's code (a refactor must
  not quietly turn a mutant into a no-op, or a moved line into a mutant of
  nothing);
- every test a mutant names exists, and docs/guarantees.md cites it under a
  promise (a mutant is killed by the tests the guarantees rest on, not by a
  test nobody points to);
- every promise has a mutant in the CI subset."""

import ast
from pathlib import Path

import pytest

from tests.mutations.run import MUTANTS, PROMISES, ROOT, mutated

GUARANTEES = (ROOT / "docs" / "guarantees.md").read_text()


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_the_mutant_applies_to_the_code_as_it_is_now(mutant):
    source = (ROOT / mutant.path).read_text()
    assert mutated(mutant, source) != source
    assert mutant.promise in PROMISES


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_the_mutants_tests_exist_and_the_guarantees_cite_them(mutant):
    for node in mutant.tests:
        path, _, name = node.partition("::")
        assert (ROOT / path).is_file(), node
        if name:
            assert name.split("[")[0] in _defined(ROOT / path), node
    cited = [node for node in mutant.tests
             if node.partition("::")[0] in GUARANTEES  # the file (a test file is cited whole)
             or (node.partition("::")[2] or "\0") in GUARANTEES]  # or the test itself
    assert cited, f"docs/guarantees.md cites none of {mutant.name}'s tests"
    assert f"`{mutant.name}`" in GUARANTEES, f"docs/guarantees.md does not name {mutant.name}"


def test_every_promise_has_a_mutant_in_the_ci_subset():
    assert {m.promise for m in MUTANTS if m.ci} == set(PROMISES)
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
