import signal
import threading

from django.core.management.base import BaseCommand

from workflows.engine import dispatcher_loop


class Command(BaseCommand):
    help = ("Run the dispatcher loop: recover expired leases, enqueue due retries, settle "
            "orphaned cancels, re-enqueue lost messages. Safe to run on many machines at once. "
            "Stops cleanly on SIGTERM or SIGINT (the current pass finishes first).")

    def add_arguments(self, parser):
        parser.add_argument("--poll", type=float, default=None,
                            help="seconds between passes when idle "
                                 "(default PILOT_DISPATCHER_POLL_SECONDS)")

    def handle(self, *args, poll=None, **options):
        stop = threading.Event()

        def request_stop(signum, frame):
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        passes = dispatcher_loop(stop, poll=poll)
        self.stdout.write(f"dispatcher stopped after {passes} passes")
