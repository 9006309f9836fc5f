from django.core.management.base import BaseCommand, CommandError

from workflows.accounts import client_secrets_reseal
from workflows.accounts.vault import SecretUnreadable


class Command(BaseCommand):
    help = ("Seal every client webhook secret again under the first key of PILOT_SECRETS_KEYS "
            "(docs/security.md, \"Secrets at rest\"). Put the new key first, keep the old one "
            "listed, run this, then remove the old key.")

    def handle(self, *args, **options):
        try:
            count = client_secrets_reseal()
        except SecretUnreadable as exc:
            raise CommandError(f"a client's secret cannot be opened: {exc}") from None
        self.stdout.write(f"sealed {count} client webhook secret(s) under the first key")
