from django.core.management.base import BaseCommand, CommandError

from workflows.accounts import ApiClientRefused, api_client_create, api_client_scope


class Command(BaseCommand):
    help = ("Create an upstream API client: a user with the trigger permission and a token "
            "for `Authorization: Token <token>`. The token is printed once; --rotate replaces "
            "it (the old one stops working at once). Running it again for an existing client "
            "keeps its token and prints none. An existing staff or superuser account is "
            "refused unless --allow-staff. Prints what the token can do. Example: "
            "manage.py create_api_client billing-service")

    def add_arguments(self, parser):
        parser.add_argument("name", help="the client's user name, e.g. billing-service")
        parser.add_argument("--rotate", action="store_true",
                            help="issue a new token, revoking the current one")
        parser.add_argument("--allow-staff", action="store_true",
                            help="accept an existing staff or superuser account (its token "
                                 "acts with all of that account's permissions)")

    def handle(self, *args, name, rotate, allow_staff, **options):
        name = name.strip()
        if not name or len(name) > 150:
            raise CommandError("NAME must be 1-150 characters")
        try:
            user, token = api_client_create(name, rotate=rotate, allow_staff=allow_staff)
        except ApiClientRefused as exc:
            raise CommandError(str(exc)) from None
        if token is None:
            self.stdout.write(f"client {user.username} already has a token (kept; it is shown "
                              "only when created). Use --rotate to issue a new one.")
        else:
            self.stdout.write(f"client {user.username}: token {token}")
        self.stdout.write("This token can:")
        for line in api_client_scope(user):
            self.stdout.write(f"  - {line}")
