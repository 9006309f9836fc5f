"""A local run's credentials, kept across restarts (`make run`, DEBUG only).

`pilot_local_setup` keeps the admin password and the `local-client` token it
prints in a file next to the SQLite database (`db.sqlite3-credentials` for
the default one; `.local-credentials` in the project directory when the
database is not a SQLite file), readable by its owner only (0600) and
git-ignored. The next `make run` reuses them while they still work, so a
browser session and a pasted $TOKEN survive a restart; `manage.py
local_credentials` (`make credentials`) prints them again. docs/operations.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.conf import settings


def credentials_path() -> Path:
    """Where the local run's credentials live: beside its SQLite database."""
    db = settings.DATABASES["default"]
    name = str(db.get("NAME") or "")
    if db["ENGINE"] == "django.db.backends.sqlite3" and name and not name.startswith(
            (":memory:", "file:")):
        return Path(f"{name}-credentials")
    return Path(getattr(settings, "BASE_DIR", Path.cwd())) / ".local-credentials"


def credentials_read(path: Path) -> dict[str, str] | None:
    """The saved credentials, None when there are none (or the file is not ours)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    keys = ("user", "password", "token", "client")
    if not isinstance(saved, dict) or not all(isinstance(saved.get(k), str) for k in keys):
        return None
    return {k: saved[k] for k in keys}


def credentials_write(path: Path, *, user: str, password: str, token: str, client: str) -> None:
    """Save them, readable and writable by this user only (0600, even if the
    file existed with wider permissions)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, json.dumps({"user": user, "password": password, "token": token,
                                 "client": client}).encode() + b"\n")
    finally:
        os.close(fd)


def banner(base: str, saved: dict[str, str], path: Path) -> str:
    """The lines `make run` prints (README.md's quickstart shows them)."""
    try:
        shown = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        shown = path
    return (f"\n  PILOT is running on {base}/\n"
            f"  admin:     {base}/admin/  user {saved['user']}  password {saved['password']}\n"
            f"  API token: {saved['token']}  (client {saved['client']})\n"
            f"  Kept in {shown}: `make credentials` prints them again.\n")
