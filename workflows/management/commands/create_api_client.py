from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from workflows.accounts import (
    ApiClientRefused,
    OwnerUnavailable,
    api_client_create,
    api_client_scope,
    client_webhook_check,
    client_webhook_ensure,
)
from workflows.rules.errors import PilotError


class Command(BaseCommand):
    help = ("Create an upstream API client: a user with the trigger permission, a token for "
            "`Authorization: Token <token>` and a webhook signing secret (whsec_...) that signs "
            "its tasks' completion webhooks. The token and the secret are printed once; "
            "--rotate replaces the token, --rotate-webhook-secret the secret: the old one keeps "
            "working beside the new for PILOT_ROTATION_OVERLAP_SECONDS (a day), so the upstream "
            "system can switch over; --no-overlap stops it at once (it leaked). "
            "--token-expires-days N gives a new token an expiry. Running it again for an "
            "existing client keeps both and prints neither. --webhook URL sets the client's "
            "default endpoint (tasks triggered without a callback_url are delivered there; "
            "--webhook '' removes it). An existing staff or superuser account is refused "
            "unless --allow-staff. Prints what the token can do. "
            "Example: manage.py create_api_client billing-service --webhook "
            "https://billing.example.com/pilot-webhooks")

    def add_arguments(self, parser):
        parser.add_argument("name", help="the client's user name, e.g. billing-service")
        parser.add_argument("--rotate", action="store_true",
                            help="issue a new token; the current one keeps working for "
                                 "PILOT_ROTATION_OVERLAP_SECONDS")
        parser.add_argument("--allow-staff", action="store_true",
                            help="accept an existing staff or superuser account (its token "
                                 "acts with all of that account's permissions)")
        parser.add_argument("--webhook", metavar="URL", default=None,
                            help="the client's default webhook endpoint (http or https, a "
                                 "public host); '' removes it")
        parser.add_argument("--rotate-webhook-secret", action="store_true",
                            help="issue a new webhook signing secret; deliveries carry the "
                                 "current one's signature too for PILOT_ROTATION_OVERLAP_SECONDS")
        parser.add_argument("--no-overlap", action="store_true",
                            help="with --rotate / --rotate-webhook-secret: the old token or "
                                 "secret stops at once (it leaked)")
        parser.add_argument("--token-expires-days", type=float, default=None, metavar="DAYS",
                            help="a new token stops working this many days after it is issued")

    def handle(self, *args, name, rotate, allow_staff, webhook, rotate_webhook_secret,
               no_overlap, token_expires_days, **options):
        name = name.strip()
        if not name or len(name) > 150:
            raise CommandError("NAME must be 1-150 characters")
        if token_expires_days is not None and not 0 < token_expires_days <= 36500:
            raise CommandError("--token-expires-days must be more than 0 and at most 36500")
        expires_in = timedelta(days=token_expires_days) if token_expires_days else None
        try:
            client_webhook_check(webhook)
            user, token = api_client_create(name, rotate=rotate, allow_staff=allow_staff,
                                            overlap=not no_overlap, expires_in=expires_in)
            hook, secret = client_webhook_ensure(user, url=webhook,
                                                 rotate_secret=rotate_webhook_secret,
                                                 overlap=not no_overlap)
        except (ApiClientRefused, OwnerUnavailable) as exc:
            raise CommandError(str(exc)) from None
        except PilotError as exc:
            raise CommandError(exc.detail) from None
        if token is None:
            self.stdout.write(f"client {user.get_username()} already has a token (kept; it is "
                              "shown only when created). Use --rotate to issue a new one.")
        else:
            self.stdout.write(f"client {user.get_username()}: token {token}")
        if secret is None:
            self.stdout.write("webhook signing secret: kept (shown only when created; "
                              "--rotate-webhook-secret issues a new one)")
        else:
            self.stdout.write(f"webhook signing secret: {secret}")
        self.stdout.write(f"default webhook endpoint: {hook.url or '(none)'}")
        self.stdout.write("This token can:")
        for line in api_client_scope(user):
            self.stdout.write(f"  - {line}")
