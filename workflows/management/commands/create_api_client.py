from django.core.management.base import BaseCommand, CommandError

from workflows.accounts import (
    ApiClientRefused,
    api_client_create,
    api_client_scope,
    client_webhook_check,
    client_webhook_ensure,
)
from workflows.errors import PilotError


class Command(BaseCommand):
    help = ("Create an upstream API client: a user with the trigger permission, a token for "
            "`Authorization: Token <token>` and a webhook signing secret (whsec_...) that signs "
            "its tasks' completion webhooks. The token and the secret are printed once; "
            "--rotate replaces the token, --rotate-webhook-secret the secret (the old ones stop "
            "working at once). Running it again for an existing client keeps both and prints "
            "neither. --webhook URL sets the client's default endpoint (tasks triggered without "
            "a callback_url are delivered there; --webhook '' removes it). An existing staff or "
            "superuser account is refused unless --allow-staff. Prints what the token can do. "
            "Example: manage.py create_api_client billing-service --webhook "
            "https://billing.example.com/pilot-webhooks")

    def add_arguments(self, parser):
        parser.add_argument("name", help="the client's user name, e.g. billing-service")
        parser.add_argument("--rotate", action="store_true",
                            help="issue a new token, revoking the current one")
        parser.add_argument("--allow-staff", action="store_true",
                            help="accept an existing staff or superuser account (its token "
                                 "acts with all of that account's permissions)")
        parser.add_argument("--webhook", metavar="URL", default=None,
                            help="the client's default webhook endpoint (http or https, a "
                                 "public host); '' removes it")
        parser.add_argument("--rotate-webhook-secret", action="store_true",
                            help="issue a new webhook signing secret, replacing the current one")

    def handle(self, *args, name, rotate, allow_staff, webhook, rotate_webhook_secret,
               **options):
        name = name.strip()
        if not name or len(name) > 150:
            raise CommandError("NAME must be 1-150 characters")
        try:
            client_webhook_check(webhook)
            user, token = api_client_create(name, rotate=rotate, allow_staff=allow_staff)
            hook, secret = client_webhook_ensure(user, url=webhook,
                                                 rotate_secret=rotate_webhook_secret)
        except ApiClientRefused as exc:
            raise CommandError(str(exc)) from None
        except PilotError as exc:
            raise CommandError(exc.detail) from None
        if token is None:
            self.stdout.write(f"client {user.username} already has a token (kept; it is shown "
                              "only when created). Use --rotate to issue a new one.")
        else:
            self.stdout.write(f"client {user.username}: token {token}")
        if secret is None:
            self.stdout.write("webhook signing secret: kept (shown only when created; "
                              "--rotate-webhook-secret issues a new one)")
        else:
            self.stdout.write(f"webhook signing secret: {secret}")
        self.stdout.write(f"default webhook endpoint: {hook.url or '(none)'}")
        self.stdout.write("This token can:")
        for line in api_client_scope(user):
            self.stdout.write(f"  - {line}")
