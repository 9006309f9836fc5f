"""An import-linter contract type of PILOT's own (pyproject.toml,
[tool.importlinter]): some modules may not import given *names* from a module
— `connection` from `django.db`, say, which is an attribute, not a module, so a
`forbidden` contract cannot name it (docs/design.md, "The store")."""

from __future__ import annotations

import ast

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output
from importlinter.domain.helpers import module_expressions_to_modules


class NamesNotImportedContract(Contract):
    """`source_modules` (less `ignore_modules`) may not `from <module> import`
    any of `names`."""

    type_name = "names_not_imported"
    source_modules = fields.ListField(subfield=fields.ModuleExpressionField())
    ignore_modules = fields.ListField(subfield=fields.ModuleExpressionField(), required=False)
    module = fields.StringField()
    names = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        sources = module_expressions_to_modules(graph, self.source_modules)
        ignored = module_expressions_to_modules(graph, self.ignore_modules or [])
        names, root = set(self.names), str(self.module).split(".")[0]
        found = []
        for source in sorted(sources - ignored, key=lambda m: m.name):
            if root not in graph.find_modules_directly_imported_by(source.name):
                continue
            for detail in graph.get_import_details(importer=source.name, imported=root):
                try:
                    tree = ast.parse(detail["line_contents"].strip())
                except SyntaxError:  # a multi-line import: its first line is all grimp keeps
                    tree = ast.parse(detail["line_contents"].strip().rstrip("(") + "_")
                for node in ast.walk(tree):
                    if isinstance(node, ast.ImportFrom) and node.module == str(self.module):
                        bad = names & {alias.name for alias in node.names}
                        found += [(source.name, detail["line_number"], n) for n in sorted(bad)]
        return ContractCheck(kept=not found, warnings=None, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, line, name in check.metadata["found"]:
            output.print_error(f"{importer}:{line} imports {name} from {self.module}")
            output.new_line()
