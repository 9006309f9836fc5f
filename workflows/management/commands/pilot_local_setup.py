from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workflows import localcreds
from workflows.accounts import api_client_create, local_admin_ensure, local_credentials_valid
from workflows.localcreds import banner, credentials_read, credentials_write


class Command(BaseCommand):
    help = ("For a local run only (DJANGO_DEBUG=true): ensure the `admin` superuser and a "
            "`local-client` API token and print both. They are kept (0600) next to the SQLite "
            "database and reused while they still work; --fresh (or a fresh database) makes "
            "new ones.")

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000,
                            help="the port `make run` serves on, for the printed URLs")
        parser.add_argument("--fresh", action="store_true",
                            help="a new admin password and a new token, whatever is kept")

    def handle(self, *args, port=8000, fresh=False, **options):
        if not settings.DEBUG:
            raise CommandError("pilot_local_setup resets the admin password; it refuses to run "
                               "unless DJANGO_DEBUG=true")
        path = localcreds.credentials_path()
        saved = None if fresh else credentials_read(path)
        if saved is None or not local_credentials_valid(
                saved["password"], saved["token"], username=saved["user"],
                client=saved["client"]):
            admin, password = local_admin_ensure()
            client, token = api_client_create("local-client", rotate=True)
            saved = {"user": admin.get_username(), "password": password, "token": token,
                     "client": client.get_username()}
            credentials_write(path, **saved)
        self.stdout.write(self.style.SUCCESS(banner(f"http://127.0.0.1:{port}", saved, path)))
