import json

from django.core.management.base import BaseCommand

from workflows.engine import dispatch_once, schedules_fire_due


class Command(BaseCommand):
    help = ("One dispatcher pass (for cron setups and emergencies): recover expired leases, "
            "enqueue due retries and orphaned compensations, re-enqueue lost messages, fire "
            "due schedules. Prints what it did as JSON.")

    def handle(self, *args, **options):
        total = {}
        while True:
            report = dispatch_once()
            for action, count in report.as_dict().items():
                total[action] = total.get(action, 0) + count
            if not report.full:
                break
        fired = schedules_fire_due()
        total["schedules_created"] = fired.created
        self.stdout.write(json.dumps(total, sort_keys=True))
