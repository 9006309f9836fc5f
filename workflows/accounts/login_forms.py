"""The admin's login and password-change forms, with the login guard's answers.

- `GuardedAdminAuthenticationForm` (admin.site.login_form, set by `install`):
  when the login guard (login_guard.py) refused an attempt before checking its
  password, it says why — locked out for N minutes, or logins paused while the
  lockout store is unreachable — instead of "wrong password". A lockout applies to
  unknown usernames alike, so this reveals nothing about which accounts exist.
- `admin_password_change` (mounted over /admin/password_change/ in
  pilot/urls.py): Django's admin view with `GuardedAdminPasswordChangeForm`,
  whose current-password check is limited like a login
  (login_guard.password_check_*). Django's AdminSite has no setting for this
  form, hence the route.
"""

from __future__ import annotations

import math

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm, AdminPasswordChangeForm
from django.core.exceptions import ValidationError
from django.urls import reverse

from workflows.accounts.login_guard import (
    REFUSED_LOCKED,
    REFUSED_UNAVAILABLE,
    password_check_failure_record,
    password_check_lockout_remaining,
    password_check_success_record,
)
from workflows.observability.shared_cache import CacheFailure

UNAVAILABLE_MESSAGE = ("Logins are paused: the lockout store cannot be reached. Try again "
                       "shortly; the operators have been alerted.")


def _minutes(seconds: float) -> int:
    return max(1, math.ceil(seconds / 60))


class GuardedAdminAuthenticationForm(AdminAuthenticationForm):
    def clean(self):
        try:
            return super().clean()
        except ValidationError:
            reason, seconds = getattr(self.request, "pilot_login_refused", (None, 0.0))
            if reason == REFUSED_LOCKED:
                raise ValidationError(
                    f"Too many failed logins: this login is locked for {_minutes(seconds)} "
                    "more minute(s). A browser you logged in with before is not affected.",
                    code="locked_out") from None
            if reason == REFUSED_UNAVAILABLE:
                raise ValidationError(UNAVAILABLE_MESSAGE,
                                      code="lockout_store_unavailable") from None
            raise


class GuardedAdminPasswordChangeForm(AdminPasswordChangeForm):
    def clean_old_password(self):
        try:
            remaining = password_check_lockout_remaining(self.user)
        except CacheFailure:
            raise ValidationError(UNAVAILABLE_MESSAGE, code="lockout_store_unavailable") \
                from None
        if remaining:
            raise ValidationError(
                f"Too many wrong current passwords: try again in {_minutes(remaining)} "
                "minute(s).", code="locked_out")
        try:
            old_password = super().clean_old_password()
        except ValidationError:
            password_check_failure_record(self.user)
            raise
        password_check_success_record(self.user)
        return old_password


def admin_password_change(request):
    """AdminSite.password_change with the guarded form (same template, context,
    success page)."""
    from django.contrib.auth.views import PasswordChangeView

    site = admin.site
    defaults = {
        "form_class": GuardedAdminPasswordChangeForm,
        "success_url": reverse("admin:password_change_done", current_app=site.name),
        "extra_context": site.each_context(request),
    }
    if site.password_change_template is not None:
        defaults["template_name"] = site.password_change_template
    request.current_app = site.name
    return PasswordChangeView.as_view(**defaults)(request)


def install() -> None:
    """Use the guarded login form on the default admin site (unless the project
    set its own)."""
    if admin.site.login_form is None:
        admin.site.login_form = GuardedAdminAuthenticationForm
