from django.core.management.base import BaseCommand, CommandError

from workflows.accounts.login_guard import login_lockouts_clear
from workflows.observability.shared_cache import CacheFailure


class Command(BaseCommand):
    help = ("Lift a login lockout before it expires by itself: the per-username bound of "
            "USERNAME (which locks it out for every browser that never logged in before), "
            "and with --address also that address's own lockouts. Example: manage.py "
            "login_unlock admin --address 203.0.113.9")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--address", help="the client address whose lockouts to lift too")

    def handle(self, *args, username, address, **options):
        try:
            login_lockouts_clear(username=username, ip=address)
        except CacheFailure as exc:
            raise CommandError(f"the lockout store cannot be reached: {exc}") from None
        what = f"{username!r}" + (f" and address {address}" if address else "")
        self.stdout.write(f"lockouts of {what} lifted")
