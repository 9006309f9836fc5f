"""PILOT's own import-linter contract type (tests/support/import_contracts.py)
breaks on the import it forbids, and only on that."""

from grimp import ImportGraph

from tests.support.import_contracts import NamesNotImportedContract


def check(line: str, importer: str = "workflows.engine.audit"):
    graph = ImportGraph()
    for module in ("workflows", "workflows.engine", "workflows.engine.audit",
                   "workflows.engine.store", "workflows.engine.store.orm"):
        graph.add_module(module)
    graph.add_module("django", is_squashed=True)
    graph.add_import(importer=importer, imported="django", line_number=3, line_contents=line)
    contract = NamesNotImportedContract(
        name="test", session_options={"root_packages": ["workflows"]},
        contract_options={"source_modules": ["workflows.engine", "workflows.engine.**"],
                          "ignore_modules": ["workflows.engine.store",
                                             "workflows.engine.store.**"],
                          "module": "django.db", "names": ["connection", "connections"]})
    return contract.check(graph, verbose=False)


def test_importing_a_forbidden_name_breaks_the_contract():
    broken = check("from django.db import connection, transaction")
    assert not broken.kept
    assert broken.metadata["found"] == [("workflows.engine.audit", 3, "connection")]


def test_other_names_and_the_store_keep_it():
    assert check("from django.db import transaction").kept
    assert check("from django.db.models import Q").kept
    assert check("from django.db import connection",
                 importer="workflows.engine.store.orm").kept
