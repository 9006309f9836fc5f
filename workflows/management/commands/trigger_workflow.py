import json
import sys
import uuid
from argparse import RawDescriptionHelpFormatter
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from workflows.accounts import CLI_OWNER, cli_owner_get
from workflows.engine import task_trigger
from workflows.rules.errors import PilotError
from workflows.rules.states import Source, TaskState
from workflows.selectors import task_wait_finished

EXIT_REFUSED, EXIT_FAILED, EXIT_TIMEOUT = 1, 2, 3


def read_payload(text: str) -> dict:
    """JSON, `@path` (a file), or `@-` (standard input)."""
    source = "--payload"
    if text.startswith("@"):
        source = text[1:]
        try:
            text = sys.stdin.read() if source == "-" else Path(source).read_text()
        except OSError as exc:
            raise CommandError(f"cannot read the payload from {source}: {exc.strerror}") from None
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise CommandError(f"the payload from {source} is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise CommandError("the payload must be a JSON object")
    return payload


class Command(BaseCommand):
    help = ("Trigger a workflow from the command line: the same engine call as "
            "POST /api/v1/tasks (source=cli), with the same idempotency rules.")

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.formatter_class = RawDescriptionHelpFormatter
        parser.epilog = f"""\
outcomes: created (a new task), replayed (the key was already used with the same
payload: nothing new), restarted (the key's task had failed: it runs again from its
checkpoints), refused (printed with its error code).

owner: keys are scoped per owner. By default tasks belong to the `{CLI_OWNER}` user
(created on first use, no password), so keys typed here never collide with an
upstream client's; --owner NAME acts for an existing user instead.

exit status: 0 triggered (with --wait: and the task succeeded); {EXIT_REFUSED} refused or
bad arguments; {EXIT_FAILED} with --wait, the task ended failed or cancelled; {EXIT_TIMEOUT} with
--wait, --timeout passed first (the task goes on running).

examples:
  manage.py trigger_workflow demo.echo --key hello-1 --payload '{{"msg": "hi"}}'
  manage.py trigger_workflow demo.sync_orders --key b-7 --payload @batch7.json --wait
"""
        return parser

    def add_arguments(self, parser):
        parser.add_argument("workflow", metavar="NAME", help="registered workflow name")
        parser.add_argument("--key", help="idempotency key (required unless the workflow "
                                          "derives keys from its payload)")
        parser.add_argument("--payload", default="{}", metavar="JSON|@FILE",
                            help="the payload: a JSON object, @path to read it from a file, "
                                 "@- for standard input (default {})")
        parser.add_argument("--owner", metavar="USER",
                            help=f"the user the task belongs to (default: {CLI_OWNER})")
        parser.add_argument("--wait", action="store_true",
                            help="wait for the task to finish; print its final state and "
                                 "result (needs running workers)")
        parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                            help="with --wait, give up after this long (default 300)")
        parser.add_argument("--json", action="store_true",
                            help="print one JSON object instead of text")

    def handle(self, *args, workflow, key, payload, owner, wait, timeout, json: bool,
               **options):
        if timeout <= 0:
            raise CommandError("--timeout must be positive")
        body = read_payload(payload)
        try:
            user = cli_owner_get(owner)
        except LookupError as exc:
            raise CommandError(f"--owner: {exc}" if owner else str(exc)) from None
        trace_id = uuid.uuid4().hex
        try:
            outcome = task_trigger(owner=user, key=key, workflow=workflow, payload=body,
                                   source=Source.CLI, trace_id=trace_id)
        except PilotError as exc:
            raise CommandError(f"refused ({exc.code}): {exc.detail}",
                               returncode=EXIT_REFUSED) from None
        task = outcome.task
        report = {"outcome": outcome.outcome, "task_id": str(task.pk), "workflow": task.workflow,
                  "key": task.idempotency_key, "owner": user.get_username(),
                  "state": task.state, "trace_id": task.trace_id or trace_id}
        if not json:
            self.stdout.write(f"{outcome.outcome}: task {task.pk} ({task.workflow}, key "
                              f"{task.idempotency_key!r}, owner {user.get_username()}) is "
                              f"{task.state}")
        if wait:
            task = task_wait_finished(task.pk, timeout=timeout)
            report |= {"state": task.state, "result": task.result,
                       "error": task.error or None, "attempts": task.attempts}
        succeeded = TaskState.SUCCEEDED == task.state  # noqa: SIM300 - the no-write guard greps this
        if json:
            self.stdout.write(_dumps(report))
        elif wait:
            self.stdout.write(f"final state: {task.state} after {task.attempts} attempt(s)")
            if succeeded:
                self.stdout.write(f"result: {_dumps(task.result)}")
            elif task.error:
                self.stdout.write(f"error: {task.error}")
        if not wait or succeeded:
            return
        if not task.is_finished:
            raise CommandError(f"task {task.pk} is still {task.state} after {timeout:g}s",
                               returncode=EXIT_TIMEOUT)
        raise CommandError(f"task {task.pk} ended {task.state}", returncode=EXIT_FAILED)


def _dumps(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)
