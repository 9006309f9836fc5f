from django.core.management.base import BaseCommand, CommandError

from workflows.accounts import api_client_create


class Command(BaseCommand):
    help = ("Create an upstream API client: a user with the trigger permission and a token "
            "for `Authorization: Token <token>`. The token is printed once; --rotate replaces "
            "it (the old one stops working at once). Running it again for an existing client "
            "keeps its token and prints none. Example: manage.py create_api_client "
            "billing-service")

    def add_arguments(self, parser):
        parser.add_argument("name", help="the client's user name, e.g. billing-service")
        parser.add_argument("--rotate", action="store_true",
                            help="issue a new token, revoking the current one")

    def handle(self, *args, name, rotate, **options):
        name = name.strip()
        if not name or len(name) > 150:
            raise CommandError("NAME must be 1-150 characters")
        user, token = api_client_create(name, rotate=rotate)
        if token is None:
            self.stdout.write(f"client {user.username} already has a token (kept; it is shown "
                              "only when created). Use --rotate to issue a new one.")
            return
        self.stdout.write(f"client {user.username}: token {token}")
