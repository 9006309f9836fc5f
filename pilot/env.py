"""Typed readers for environment variables that refuse bad values.

Every setting PILOT reads from the environment goes through one of these, so a
typo in a deployment (`PILOT_LEASE_SECONDS=6o`) stops the process at start-up
with the variable's name in the message instead of surfacing later as a
confusing runtime error.
"""

import os

from django.core.exceptions import ImproperlyConfigured

from workflows.conf import Setting


def _read(name: str, kind: type, default, minimum=None):
    """The variable's value parsed as `kind` by the rules PILOT's own settings use
    (workflows/conf.py, Setting.parse), or `default` when it is unset or empty."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return Setting(name, kind, default, "", minimum=minimum).parse(raw)


def env_str(name: str, default: str | None = None, *, required: bool = False) -> str | None:
    value = os.environ.get(name)
    if value is None or value == "":
        if required:
            raise ImproperlyConfigured(f"{name} must be set")
        return default
    return value


def env_bool(name: str, default: bool = False) -> bool:
    if os.environ.get(name) == "":
        return False  # set, to nothing: off (as "false")
    return _read(name, bool, default)


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    return _read(name, int, default, minimum)


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    return _read(name, float, default, minimum)


def env_list(name: str, default: str) -> list[str]:
    raw = os.environ.get(name, default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={raw!r} must be one of: {', '.join(choices)}")
    return value


# What example files and tutorials put where a secret belongs.
_PLACEHOLDERS = ("change-me", "changeme", "change_me", "django-insecure-", "replace-me",
                 "your-secret")


def refuse_placeholder(name: str, value: str, *, minimum: int) -> None:
    """ImproperlyConfigured unless `value` looks like a real secret: at least
    `minimum` characters and no placeholder text (deploy/pilot.env.example's
    `change-me` must not start a production process)."""
    lowered = value.lower()
    if any(p in lowered for p in _PLACEHOLDERS):
        raise ImproperlyConfigured(
            f"{name} is a placeholder ({value[:12]}…): set a random value, e.g. "
            "python -c \"import secrets; print(secrets.token_urlsafe(50))\"")
    if len(value) < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum} random characters "
                                   f"(it has {len(value)})")


def local_secret_key(path) -> str:
    """The secret key of a local (DEBUG) run: random, generated once per checkout
    into `path` (mode 0600, ignored by git) and read back on every later start,
    so sessions survive restarts and no two checkouts share a key — never a
    constant published with the code. Raises ImproperlyConfigured when the file
    can be neither read nor created (then set DJANGO_SECRET_KEY)."""
    import secrets
    import tempfile
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        # Written whole to a private temporary file, then linked into place:
        # a process starting beside this one sees no file or the whole key.
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".secret-")  # mode 0600
            try:
                with os.fdopen(fd, "w") as out:
                    out.write(secrets.token_urlsafe(50) + "\n")
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process won; use its key
            finally:
                os.unlink(tmp)
        except OSError as exc:
            raise ImproperlyConfigured(
                f"cannot create the local secret key file {path} ({exc}); "
                "set DJANGO_SECRET_KEY") from None
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise ImproperlyConfigured(
            f"cannot read the local secret key file {path} ({exc}); set DJANGO_SECRET_KEY"
        ) from None
    if len(key) < 50:
        raise ImproperlyConfigured(
            f"the local secret key file {path} is empty or truncated; delete it to get a new "
            "key, or set DJANGO_SECRET_KEY")
    return key
