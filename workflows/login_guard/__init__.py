"""The login guard as an app of its own, opt-in: `"workflows.login_guard"` in
INSTALLED_APPS (docs/embedding.md, step 3). Its code is
workflows/accounts/login_guard.py and login_forms.py; this app is what turns it
on — the failed- and successful-login receivers and the admin's guarded login
form — so a project without it (one that uses django-axes, say) has none of
its logins counted."""
