import json
import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from workflows.engine import scheduler_loop, schedules_fire_due


class Command(BaseCommand):
    help = ("Run the scheduler loop: trigger every due slot of every enabled schedule "
            "through the engine, with a key per slot, so any number of schedulers on any "
            "number of machines make one task per slot. Stops cleanly on SIGTERM or SIGINT "
            "(the current pass finishes first).")

    def add_arguments(self, parser):
        parser.add_argument("--poll", type=float, default=None,
                            help="longest sleep between passes, in seconds "
                                 "(default PILOT_SCHEDULER_POLL_SECONDS)")
        parser.add_argument("--once", action="store_true",
                            help="one pass, print what it did as JSON, exit (for cron-style "
                                 "setups and emergencies)")

    def handle(self, *args, poll=None, once=False, **options):
        if poll is not None and not poll > 0:
            raise CommandError("--poll must be a positive number of seconds")
        if once:
            self.stdout.write(json.dumps(schedules_fire_due().as_dict(), sort_keys=True))
            return
        stop = threading.Event()

        def request_stop(signum, frame):
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        passes = scheduler_loop(stop, poll=poll)
        self.stdout.write(f"scheduler stopped after {passes} passes")
