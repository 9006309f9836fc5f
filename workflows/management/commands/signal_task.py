"""manage.py signal_task TASK_ID NAME [--payload JSON|@file] [--key K]: send a
signal to a task from the command line (docs/waiting.md) — the same engine
call as POST /api/v1/tasks/{id}/signals/{name}, with the same key rules."""

import uuid
from argparse import RawDescriptionHelpFormatter

from django.core.management.base import BaseCommand, CommandError

from workflows.engine import task_signal
from workflows.management.commands.trigger_workflow import read_payload
from workflows.rules.errors import PilotError


def _actor() -> str:
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no name for this uid (a container)
        return "cli"


class Command(BaseCommand):
    help = ("Send a signal to a task: what its wait step waits for (an approval, a "
            "partner's answer). Stored before this returns; kept if the task does not "
            "wait for it yet; consumed once.")

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.formatter_class = RawDescriptionHelpFormatter
        parser.epilog = """\
key: the signal's idempotency key, scoped to the task. Sending the same key and
payload again changes nothing ("replayed"); the key with another payload is refused.
Without --key a new key is made, so each run sends a new signal.

exit status: 0 stored or replayed; 1 refused (printed with its error code).

examples:
  manage.py signal_task 5f0c…-… decision --payload '{"approved": true, "by": "ops"}'
  manage.py signal_task 5f0c…-… partner_reply --payload @reply.json --key reply-17
"""
        return parser

    def add_arguments(self, parser):
        parser.add_argument("task_id", metavar="TASK_ID", help="the task's id (a UUID)")
        parser.add_argument("name", metavar="NAME", help="the signal's name")
        parser.add_argument("--payload", default="{}", metavar="JSON|@FILE",
                            help="the signal's payload: a JSON object, @path to read it from "
                                 "a file, @- for standard input (default {})")
        parser.add_argument("--key", help="idempotency key (default: a new one)")

    def handle(self, *args, task_id, name, payload, key, **options):
        try:
            task_id = uuid.UUID(task_id)
        except ValueError:
            raise CommandError(f"{task_id!r} is not a task id (a UUID)") from None
        body = read_payload(payload)
        try:
            outcome = task_signal(task_id=task_id, name=name, payload=body,
                                  key=key or f"cli:{uuid.uuid4()}", user=None, actor=_actor())
        except PilotError as exc:
            raise CommandError(f"refused ({exc.code}): {exc.detail}") from None
        status = "replayed" if outcome.replayed else "stored"
        woke = "; the task was waiting for it and is woken" if outcome.woke else ""
        self.stdout.write(f"{status}: signal {name!r} for task {task_id} "
                          f"(task {outcome.task.state}){woke}")
