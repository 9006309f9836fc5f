"""The people and systems that use PILOT.

- this module: services for their accounts — API clients and their tokens,
  client webhook endpoints, the local admin, the CLI's and the scheduler's owners;
- `login_guard`: lockouts after failed logins and password checks (docs/security.md);
- `login_forms`: the admin's login and password-change forms, with the guard's answers.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from workflows.accounts.vault import SecretUnreadable, secret_open, secret_seal
from workflows.conf import pilot_settings
from workflows.models.token import ApiToken, token_digest, token_generate
from workflows.webhooks.signing import webhook_secret_new
from workflows.webhooks.targets import target_validate


class ApiClientRefused(Exception):
    """`api_client_create` will not attach a token to this account."""


class OwnerUnavailable(LookupError):
    """The host's user model cannot hold one of PILOT's accounts by name alone
    (a required field without a default): the message says which model and why."""


def user_by_name_filter(name: str) -> dict[str, str]:
    """The lookup for the account called `name` in the host's user model: its
    USERNAME_FIELD (`username`, or `email` on an email-login model)."""
    return {get_user_model().USERNAME_FIELD: name}


def _user_ensure(name: str, **defaults):
    """(user, created) for the account `name` of the host's user model, by its
    USERNAME_FIELD; a new one gets no usable password. OwnerUnavailable when
    the model will not take a row from its name alone (a required field of the
    host's own), instead of the database's error."""
    User = get_user_model()
    fields = {f.name for f in User._meta.get_fields()}
    try:
        with transaction.atomic():
            user, created = User.objects.get_or_create(
                **user_by_name_filter(name),
                defaults={k: v for k, v in defaults.items() if k in fields})
            if created:
                user.set_unusable_password()
                user.save(update_fields=["password"])
    except (IntegrityError, ValidationError, TypeError, ValueError) as exc:
        label = User._meta.label
        raise OwnerUnavailable(
            f"cannot create the account {name!r} in {label} (found by "
            f"{User.USERNAME_FIELD}): {exc}. Create it yourself with the fields {label} "
            "requires, then run this again.") from None
    return user, created


def is_system_owner(user) -> bool:
    """PILOT's own owners (`cli`, `scheduler`): they own the runs the CLI and the
    schedules start, of every origin, so a token on one would read them all."""
    return user.get_username() in SYSTEM_OWNERS


def api_client_create(name: str, *, rotate: bool = False, allow_staff: bool = False,
                      overlap: bool = True,
                      expires_in: timedelta | None = None) -> tuple[object, str | None]:
    """Ensure an upstream client: a user without a password, with the trigger
    permission (`workflows.add_task`; `workflows.signal_task` for its own tasks)
    and an API token (stored hashed: models.token).

    An existing staff or superuser account is refused (ApiClientRefused) unless
    `allow_staff`: a token on it would carry every permission of a person's
    account (a superuser's token reads, cancels and retries every client's
    tasks), and nobody should get that by a typo in NAME.

    Returns (user, token_key). token_key is the new token when one was created
    (first call, or `rotate=True`: see `api_token_issue` for what becomes of
    the old one, `overlap` and `expires_in`), and None when the existing token
    was kept: only its hash is stored, so it can be shown once, never again."""
    if name in SYSTEM_OWNERS:
        raise ApiClientRefused(
            f"{name!r} is one of PILOT's own owners (the runs the CLI and the schedules "
            "start, or Django's tasks, belong to it): a token would read every one of them. "
            "Choose another NAME.")
    with transaction.atomic():
        user, created = _user_ensure(name)
        if not created and (user.is_staff or user.is_superuser) and not allow_staff:
            kind = "a superuser" if user.is_superuser else "a staff account"
            raise ApiClientRefused(
                f"{name!r} is {kind}: a token would act with all of its permissions. "
                "Choose another NAME for the upstream system, or pass --allow-staff if "
                "this is really meant.")
        # Trigger, and signal its own tasks (docs/waiting.md).
        user.user_permissions.add(*Permission.objects.filter(
            codename__in=("add_task", "signal_task"), content_type__app_label="workflows"))
        existing = ApiToken.objects.select_for_update().filter(user=user).first()
        if existing and not rotate:
            return user, None
        return user, api_token_issue(user, overlap=overlap, expires_in=expires_in)


def _overlap_end(now: datetime, overlap: bool) -> datetime | None:
    seconds = float(pilot_settings.PILOT_ROTATION_OVERLAP_SECONDS)
    return now + timedelta(seconds=seconds) if overlap and seconds > 0 else None


def api_token_issue(user, *, overlap: bool = True, expires_in: timedelta | None = None) -> str:
    """A new API token for `user` (expiring after `expires_in`, if given).

    The token it replaces keeps authenticating until PILOT_ROTATION_OVERLAP_SECONDS
    from now (or its own earlier expiry), so the upstream system can switch over
    without a refused request; with `overlap=False` (a token that leaked), or
    an overlap of 0, it stops at once. Only the newest replaced token overlaps:
    any older one is deleted. Returns the secret: the only time it exists
    outside the caller's hands, since only its hash is stored."""
    key, visible = token_generate()
    now = timezone.now()
    with transaction.atomic():
        tokens = list(ApiToken.objects.select_for_update().filter(user=user)
                      .order_by("-created_at", "-pk"))
        until = _overlap_end(now, overlap)
        keep = tokens[0] if tokens and until is not None else None
        replaced = ApiToken.objects.filter(user=user)
        if keep is not None:
            replaced = replaced.exclude(pk=keep.pk)
        replaced.delete()
        if keep is not None:
            ApiToken.objects.filter(pk=keep.pk).filter(
                Q(expires_at__isnull=True) | Q(expires_at__gt=until)).update(expires_at=until)
        ApiToken.objects.create(user=user, prefix=visible, digest=token_digest(key),
                                expires_at=now + expires_in if expires_in else None)
    return key


def client_webhook_check(url: str | None) -> None:
    """Refuse (ValidationFailed) a default endpoint before anything is created."""
    if url:
        target_validate(url, field="webhook")


def client_webhook_ensure(user, *, url: str | None = None, rotate_secret: bool = False,
                          overlap: bool = True) -> tuple[object, str | None]:
    """Ensure `user` has a webhook signing secret, and set its default endpoint
    when `url` is given ("" removes it). The URL is checked like a trigger's
    callback_url (http(s), a public host; ValidationFailed otherwise) and
    applies to tasks triggered from now on.

    Returns (ClientWebhook, secret): secret is the new `whsec_…` when one was
    created (first call, or `rotate_secret=True`), None when the existing
    secret was kept — secrets are shown once. Stored sealed (accounts.vault).

    A rotation keeps the replaced secret signing beside the new one until
    PILOT_ROTATION_OVERLAP_SECONDS from now (every delivery then carries both
    signatures, `v1,<new> v1,<old>`, as Standard Webhooks allows), so a
    receiver verifies with either while it is switched over; `overlap=False`
    (a secret that leaked), or an overlap of 0, drops the old one at once."""
    from workflows.models import ClientWebhook

    client_webhook_check(url)
    with transaction.atomic():
        hook = ClientWebhook.objects.select_for_update().filter(owner=user).first()
        new_secret = None
        if hook is None:
            new_secret = webhook_secret_new()
            hook = ClientWebhook.objects.create(owner=user, secret=secret_seal(new_secret),
                                                url=url or "")
            return hook, new_secret
        changes: dict[str, object] = {}
        if rotate_secret:
            new_secret = webhook_secret_new()
            until = _overlap_end(timezone.now(), overlap)
            changes.update(secret=secret_seal(new_secret),
                           previous_secret=hook.secret if until else "",
                           previous_until=until)
        if url is not None:
            changes["url"] = url
        if changes:
            ClientWebhook.objects.filter(pk=hook.pk).update(**changes, updated_at=Now())
            hook.refresh_from_db()
    return hook, new_secret


def client_signing_secrets(owner_id, now: datetime) -> tuple[str, ...]:
    """The secrets a delivery of `owner_id`'s tasks is signed with at `now`: the
    current one, then the one a rotation replaced while its overlap lasts. ()
    when the client has none — or when none can be opened (the keys changed:
    logged as `webhook_secret_unreadable`), which a send reports as unsigned."""
    from workflows.models import ClientWebhook
    from workflows.observability.events import Event, emit

    row = (ClientWebhook.objects.filter(owner_id=owner_id)
           .values_list("secret", "previous_secret", "previous_until").first())
    if row is None:
        return ()
    current, previous, until = row
    sealed = [current] + ([previous] if previous and until is not None and until > now else [])
    try:
        return tuple(secret_open(value) for value in sealed)
    except SecretUnreadable as exc:
        emit(Event.WEBHOOK_SECRET_UNREADABLE, level=logging.ERROR, owner_id=owner_id,
             error=str(exc))
        return ()


def client_secrets_reseal() -> int:
    """Seal every client's secrets again under the first key of PILOT_SECRETS_KEYS
    (after a new key was put first), one row lock at a time; returns how many
    rows were rewritten. SecretUnreadable (nothing changed for that row or the
    ones after it) when a row opens with none of the keys."""
    from workflows.accounts.vault import secret_reseal
    from workflows.models import ClientWebhook

    count = 0
    for owner_id in ClientWebhook.objects.values_list("owner_id", flat=True):
        with transaction.atomic():
            hook = ClientWebhook.objects.select_for_update().filter(owner_id=owner_id).first()
            if hook is None:
                continue
            ClientWebhook.objects.filter(pk=hook.pk).update(
                secret=secret_reseal(hook.secret),
                previous_secret=secret_reseal(hook.previous_secret))
            count += 1
    return count


def api_client_scope(user) -> list[str]:
    """What a token of `user` can do through the API, one sentence each, from
    the permissions the account really holds."""
    lines = []
    if user.has_perm("workflows.add_task"):
        lines.append("trigger workflows (workflows.add_task)")
    lines.append("read, cancel and retry the tasks it triggered itself")
    if user.has_perm("workflows.signal_task"):
        lines.append("send signals to the tasks it triggered itself (workflows.signal_task)")
    if user.is_superuser:
        lines.append("EVERYTHING ELSE TOO: it is a superuser — it reads, cancels and "
                     "retries every client's tasks")
        return lines
    if user.has_perm("workflows.view_all_tasks"):
        lines.append("read EVERY client's tasks, payloads and results "
                     "(workflows.view_all_tasks)")
        lines.extend(f"{action} every client's tasks (workflows.{action}_task)"
                     for action in ("cancel", "retry") if user.has_perm(f"workflows.{action}_task"))
    if user.is_staff:
        lines.append("(the account is staff: with its password it also logs into the admin)")
    return lines


def local_admin_ensure(username: str = "admin") -> tuple[object, str]:
    """Create (or reset) a superuser for a local run with a fresh random password,
    returned so it can be printed."""
    password = secrets.token_urlsafe(12)
    with transaction.atomic():
        user, _ = _user_ensure(username, email=f"{username}@localhost")
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
    return user, password


def local_credentials_valid(password: str, token: str, *, username: str = "admin",
                            client: str = "local-client") -> bool:
    """Whether a local run's saved credentials still open the door: `password`
    is the active superuser `username`'s and `token` an unexpired token of
    `client` (a fresh database, or a password changed in the console, has
    neither)."""
    User = get_user_model()
    admin = User.objects.filter(**user_by_name_filter(username), is_active=True,
                                is_superuser=True).first()
    if admin is None or not admin.check_password(password):
        return False
    owner = User.objects.filter(**user_by_name_filter(client)).first()
    return owner is not None and ApiToken.objects.filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()),
        user=owner, digest=token_digest(token)).exists()


CLI_OWNER = "cli"


def cli_owner_get(username: str | None = None):
    """The user a `trigger_workflow` call acts for. Without `username`, the `cli`
    user (created on first use, without a password or permissions: it only
    owns tasks), so keys typed at a terminal have their own namespace and can
    never collide with an upstream client's. With `username`, that existing
    user (to act on a client's behalf, e.g. replaying its request); raises
    LookupError if there is none."""
    User = get_user_model()
    if username is None:
        return _user_ensure(CLI_OWNER)[0]
    try:
        return User.objects.get(**user_by_name_filter(username))
    except User.DoesNotExist:
        raise LookupError(f"no user named {username!r}") from None


SCHEDULER_OWNER = "scheduler"
TASKS_OWNER = "tasks"
SYSTEM_OWNERS = frozenset({CLI_OWNER, SCHEDULER_OWNER, TASKS_OWNER})


def schedule_owner_problem(user) -> str:
    """Why `user` may not own a schedule's runs ("" if it may): a superuser's
    runs would be read and acted on with every permission, and a deactivated
    client's should stop, not go on."""
    if user is None or not getattr(user, "pk", None):
        return "An existing user is required."
    if not user.is_active:
        return f"{user.get_username()} is inactive: its schedules do not run."
    if user.is_superuser:
        return f"{user.get_username()} is a superuser: a schedule may not run as one."
    return ""


def scheduler_owner_get(username: str | None = None):
    """The default owner of schedules: the `scheduler` user (created on first
    use, without a password or permissions: it only owns the runs schedules
    start), so schedule keys have a namespace of their own. With `username`,
    that existing user (e.g. an upstream client that should see the runs in its
    own task list); raises LookupError if there is none."""
    User = get_user_model()
    if username is None or username == SCHEDULER_OWNER:
        return _user_ensure(SCHEDULER_OWNER)[0]
    try:
        return User.objects.get(**user_by_name_filter(username))
    except User.DoesNotExist:
        raise LookupError(f"no user named {username!r}") from None


def tasks_owner_get(username: str | None = None):
    """The user the tasks enqueued through Django's task framework belong to
    (workflows/django_tasks.py): without `username`, the `tasks` user (created
    on first use, without a password or permissions: it only owns tasks), so
    the keys derived from task arguments have a namespace of their own. With
    `username` (the backend's OPTIONS["OWNER"]), that existing user, e.g. an
    API client that should see the runs in its own task list; raises
    LookupError if there is none."""
    User = get_user_model()
    if username is None or username == TASKS_OWNER:
        return _user_ensure(TASKS_OWNER)[0]
    try:
        return User.objects.get(**user_by_name_filter(username))
    except User.DoesNotExist:
        raise LookupError(f"no user named {username!r}") from None
