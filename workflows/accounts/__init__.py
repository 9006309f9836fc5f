"""The people and systems that use PILOT.

- this module: services for their accounts — API clients and their tokens,
  client webhook endpoints, the local admin, the CLI's and the scheduler's owners;
- `login_guard`: lockouts after failed logins and password checks (docs/security.md);
- `login_forms`: the admin's login and password-change forms, with the guard's answers.
"""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import transaction
from django.db.models.functions import Now

from workflows.models.token import ApiToken, token_digest, token_generate
from workflows.webhooks.signing import webhook_secret_new
from workflows.webhooks.targets import target_validate


class ApiClientRefused(Exception):
    """`api_client_create` will not attach a token to this account."""


def api_client_create(name: str, *, rotate: bool = False,
                      allow_staff: bool = False) -> tuple[object, str | None]:
    """Ensure an upstream client: a user without a password, with the trigger
    permission (`workflows.add_task`) and an API token (stored hashed:
    models.token).

    An existing staff or superuser account is refused (ApiClientRefused) unless
    `allow_staff`: a token on it would carry every permission of a person's
    account (a superuser's token reads, cancels and retries every client's
    tasks), and nobody should get that by a typo in NAME.

    Returns (user, token_key). token_key is the new token when one was created
    (first call, or `rotate=True`, which invalidates the old one at once), and
    None when the existing token was kept: only its hash is stored, so it can
    be shown once, never again."""
    User = get_user_model()
    with transaction.atomic():
        user, created = User.objects.get_or_create(username=name)
        if not created and (user.is_staff or user.is_superuser) and not allow_staff:
            kind = "a superuser" if user.is_superuser else "a staff account"
            raise ApiClientRefused(
                f"{name!r} is {kind}: a token would act with all of its permissions. "
                "Choose another NAME for the upstream system, or pass --allow-staff if "
                "this is really meant.")
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        user.user_permissions.add(
            Permission.objects.get(codename="add_task", content_type__app_label="workflows"))
        existing = ApiToken.objects.select_for_update().filter(user=user).first()
        if existing and not rotate:
            return user, None
        return user, api_token_issue(user)


def api_token_issue(user) -> str:
    """A new API token for `user`, replacing any it had (which stops working at
    once). Returns the secret: the only time it exists outside the caller's
    hands, since only its hash is stored."""
    key, visible = token_generate()
    with transaction.atomic():
        ApiToken.objects.filter(user=user).delete()
        ApiToken.objects.create(user=user, prefix=visible, digest=token_digest(key))
    return key


def client_webhook_check(url: str | None) -> None:
    """Refuse (ValidationFailed) a default endpoint before anything is created."""
    if url:
        target_validate(url, field="webhook")


def client_webhook_ensure(user, *, url: str | None = None,
                          rotate_secret: bool = False) -> tuple[object, str | None]:
    """Ensure `user` has a webhook signing secret, and set its default endpoint
    when `url` is given ("" removes it). The URL is checked like a trigger's
    callback_url (http(s), a public host; ValidationFailed otherwise) and
    applies to tasks triggered from now on.

    Returns (ClientWebhook, secret): secret is the new `whsec_…` when one was
    created (first call, or `rotate_secret=True`, which replaces the old one
    at once: deliveries from then on are signed with the new one), None when the
    existing secret was kept — secrets are shown once."""
    from workflows.models import ClientWebhook

    client_webhook_check(url)
    with transaction.atomic():
        hook = ClientWebhook.objects.select_for_update().filter(owner=user).first()
        new_secret = None
        if hook is None:
            new_secret = webhook_secret_new()
            hook = ClientWebhook.objects.create(owner=user, secret=new_secret,
                                                url=url or "")
            return hook, new_secret
        changes = {}
        if rotate_secret:
            new_secret = changes["secret"] = webhook_secret_new()
        if url is not None:
            changes["url"] = url
        if changes:
            ClientWebhook.objects.filter(pk=hook.pk).update(**changes, updated_at=Now())
            hook.refresh_from_db()
    return hook, new_secret


def api_client_scope(user) -> list[str]:
    """What a token of `user` can do through the API, one sentence each, from
    the permissions the account really holds."""
    lines = []
    if user.has_perm("workflows.add_task"):
        lines.append("trigger workflows (workflows.add_task)")
    lines.append("read, cancel and retry the tasks it triggered itself")
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
    User = get_user_model()
    password = secrets.token_urlsafe(12)
    with transaction.atomic():
        user, _ = User.objects.get_or_create(username=username,
                                             defaults={"email": f"{username}@localhost"})
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
    return user, password


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
        user, created = User.objects.get_or_create(username=CLI_OWNER)
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        return user
    try:
        return User.objects.get(username=username)
    except User.DoesNotExist:
        raise LookupError(f"no user named {username!r}") from None


SCHEDULER_OWNER = "scheduler"


def scheduler_owner_get(username: str | None = None):
    """The default owner of schedules: the `scheduler` user (created on first
    use, without a password or permissions: it only owns the runs schedules
    start), so schedule keys have a namespace of their own. With `username`,
    that existing user (e.g. an upstream client that should see the runs in its
    own task list); raises LookupError if there is none."""
    User = get_user_model()
    if username is None or username == SCHEDULER_OWNER:
        user, created = User.objects.get_or_create(username=SCHEDULER_OWNER)
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        return user
    try:
        return User.objects.get(username=username)
    except User.DoesNotExist:
        raise LookupError(f"no user named {username!r}") from None
