from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workflows.accounts import api_client_create, local_admin_ensure


class Command(BaseCommand):
    help = ("For a local run only (DJANGO_DEBUG=true): create or reset the `admin` superuser "
            "with a fresh password and ensure a `local-client` API token; print both.")

    def handle(self, *args, **options):
        if not settings.DEBUG:
            raise CommandError("pilot_local_setup resets the admin password; it refuses to run "
                               "unless DJANGO_DEBUG=true")
        admin, password = local_admin_ensure()
        client, token = api_client_create("local-client", rotate=True)
        self.stdout.write(self.style.SUCCESS(
            "\n  PILOT is starting on http://127.0.0.1:8000/\n"
            f"  admin:     http://127.0.0.1:8000/admin/  user {admin.username}  "
            f"password {password}\n"
            f"  API token: {token}  (client {client.username})\n"))
