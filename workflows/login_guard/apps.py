from django.apps import AppConfig


class LoginGuardConfig(AppConfig):
    name = "workflows.login_guard"
    label = "pilot_login_guard"
    verbose_name = "PILOT login guard"

    def ready(self):
        from django.contrib.auth.signals import user_logged_in, user_login_failed

        from workflows.accounts import login_forms, login_guard

        user_login_failed.connect(login_guard.on_login_failed,
                                  dispatch_uid="pilot.login_guard.failed")
        user_logged_in.connect(login_guard.on_logged_in,
                               dispatch_uid="pilot.login_guard.succeeded")
        # After the admin's autodiscovery (django.contrib.admin is ready first):
        login_forms.install()  # the login form says why the login guard refused
