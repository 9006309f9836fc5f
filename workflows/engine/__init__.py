"""The engine: the only code that changes a task's state (docs/design.md,
"Layers and doors").

api/, admin/, management commands and worker.py call these functions; each one
locks what it changes, applies a django-fsm transition, saves and audits inside
one transaction, and says in its docstring what a second call does.
"""
