from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workflows.accounts import api_client_create, local_admin_ensure


class Command(BaseCommand):
    help = ("For a local run only (DJANGO_DEBUG=true): create or reset the `admin` superuser "
            "with a fresh password and ensure a `local-client` API token; print both.")

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000,
                            help="the port `make run` serves on, for the printed URLs")

    def handle(self, *args, port=8000, **options):
        if not settings.DEBUG:
            raise CommandError("pilot_local_setup resets the admin password; it refuses to run "
                               "unless DJANGO_DEBUG=true")
        admin, password = local_admin_ensure()
        client, token = api_client_create("local-client", rotate=True)
        base = f"http://127.0.0.1:{port}"
        self.stdout.write(self.style.SUCCESS(
            f"\n  PILOT is running on {base}/\n"
            f"  admin:     {base}/admin/  user {admin.get_username()}  password {password}\n"
            f"  API token: {token}  (client {client.get_username()})\n"))
