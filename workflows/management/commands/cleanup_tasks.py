from django.core.management.base import BaseCommand, CommandError

from workflows.engine import CLEANUP_DEFAULT_BATCH as DEFAULT_BATCH
from workflows.engine import CLEANUP_DEFAULT_YIELD as DEFAULT_YIELD
from workflows.engine import CLEANUP_MAX_BATCH as MAX_BATCH
from workflows.engine import q_results_prune, tasks_cleanup
from workflows.registry import registry
from workflows.rules.durations import duration_parse


def _duration(text):
    try:
        return duration_parse(text)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


class Command(BaseCommand):
    help = ("Delete finished tasks (succeeded, failed, cancelled) whose idempotency key has "
            "expired, with their steps and history, in small batches so triggers are never "
            "blocked; their keys become free for new tasks. Unfinished tasks are never "
            "deleted. Safe to run on several machines at once and to interrupt. Also prunes "
            "django-q2's old success/failure rows. A django-q2 schedule runs it daily.")

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true",
                            help="count what would be deleted; change nothing")
        parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH,
                            help=f"tasks per transaction (1-{MAX_BATCH}, default "
                                 f"{DEFAULT_BATCH})")
        parser.add_argument("--older-than", metavar="DURATION",
                            help="instead of the expiry, delete finished tasks that finished "
                                 "longer ago than DURATION (0s, 15m, 12h, 7d, 2w)")
        parser.add_argument("--workflow", metavar="NAME",
                            help="only tasks of this workflow")
        parser.add_argument("--yield-ratio", type=float, default=DEFAULT_YIELD, metavar="R",
                            help="after each batch, pause R times as long as the batch took, "
                                 "leaving the database to the triggers (default "
                                 f"{DEFAULT_YIELD}; 0: as fast as possible)")
        parser.add_argument("--q-results-older-than", metavar="DURATION", default="7d",
                            help="prune django-q2 success/failure rows older than this "
                                 "(default 7d)")

    def handle(self, *args, dry_run, batch_size, older_than, workflow, q_results_older_than,
               yield_ratio, **options):
        if not 1 <= batch_size <= MAX_BATCH:
            raise CommandError(f"--batch-size must be between 1 and {MAX_BATCH}")
        if not 0 <= yield_ratio <= 100:
            raise CommandError("--yield-ratio must be between 0 and 100")
        age = _duration(older_than) if older_than is not None else None
        q_age = _duration(q_results_older_than)
        if workflow and registry.find(workflow) is None:
            # Tasks of a workflow that was since removed can still be cleaned up.
            self.stderr.write(f"note: {workflow!r} is not a registered workflow")
        verbosity = options["verbosity"]
        last_line = [0.0]

        def progress(report):
            # Every batch with -v 2; otherwise a line every few seconds on long runs.
            if verbosity >= 2 or (verbosity == 1 and report.seconds - last_line[0] >= 5):
                last_line[0] = report.seconds
                rate = report.tasks / max(report.seconds, 1e-6)
                self.stdout.write(f"  batch {report.batches}: {report.tasks} deleted so far "
                                  f"({rate:.0f}/s)")

        report = tasks_cleanup(older_than=age, workflow=workflow, batch_size=batch_size,
                               dry_run=dry_run, progress=progress, yield_ratio=yield_ratio)
        q_results = q_results_prune(older_than=q_age, batch_size=batch_size, dry_run=dry_run)
        verb = "would delete" if dry_run else "deleted"
        self.stdout.write(
            f"{verb} {report.tasks} finished task(s) ({report.horizon}) in {report.batches} "
            f"batch(es) of up to {batch_size}, {report.seconds:.2f}s; {verb} {q_results} "
            f"django-q2 result row(s) older than {q_results_older_than}; {verb} "
            f"{report.deliveries} ended webhook delivery(ies) whose task was gone")
