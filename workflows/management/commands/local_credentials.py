from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workflows import localcreds
from workflows.localcreds import banner, credentials_read


class Command(BaseCommand):
    help = ("For a local run only (DJANGO_DEBUG=true): print the admin password and the "
            "local-client API token `make run` keeps (`make credentials`).")

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000,
                            help="the port `make run` serves on, for the printed URLs")

    def handle(self, *args, port=8000, **options):
        if not settings.DEBUG:
            raise CommandError("local_credentials is for a local run only: it refuses to run "
                               "unless DJANGO_DEBUG=true")
        path = localcreds.credentials_path()
        saved = credentials_read(path)
        if saved is None:
            raise CommandError(f"No local credentials in {path}: `make run` makes them on its "
                               "first start.")
        self.stdout.write(banner(f"http://127.0.0.1:{port}", saved, path))
