import json
from argparse import RawDescriptionHelpFormatter

from django.core.management.base import BaseCommand, CommandError

from workflows.accounts import SCHEDULER_OWNER, scheduler_owner_get
from workflows.engine import (
    schedule_delete,
    schedule_save,
    schedule_set_enabled,
    schedules_sync_declared,
)
from workflows.management.commands.trigger_workflow import read_payload
from workflows.models import MissedPolicy
from workflows.rules.errors import PilotError
from workflows.selectors import schedule_find, schedules_all


def _describe(schedule) -> dict:
    def when(value):
        return value.isoformat() if value else None

    return {"name": schedule.name, "workflow": schedule.workflow, "cron": schedule.cron,
            "payload": schedule.payload, "missed": schedule.missed, "enabled": schedule.enabled,
            "owner": schedule.owner.get_username(), "origin": schedule.origin,
            "next_slot_at": when(schedule.next_slot_at),
            "last_fired_slot": when(schedule.last_fired_slot),
            "last_task_id": str(schedule.last_task_id) if schedule.last_task_id else None,
            "fired_count": schedule.fired_count, "last_error": schedule.last_error or None}


class Command(BaseCommand):
    help = ("Create, change, pause, delete or list schedules: periodic triggers of a workflow, "
            "one task per slot (key schedule:<name>:<slot ISO 8601 UTC>).")

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.formatter_class = RawDescriptionHelpFormatter
        parser.epilog = f"""\
cron: 5 fields (minute hour day month weekday), or 6 with seconds first
(second minute hour day month weekday), in UTC: "0 3 * * *" is 03:00 UTC every
day, "*/5 * * * * *" every five seconds.

missed (what runs for slots that passed while no scheduler ran):
  skip      none of them; the latest slot still runs if it is at most
            PILOT_SCHEDULE_GRACE_SECONDS late (the default)
  run_once  one run, for the latest missed slot
  catch_up  every missed slot, oldest first, at most 100

Changing an existing schedule: give --name and only what changes. Changing its
cron, or enabling it again, starts from the next slot after now.

owner: runs belong to the `{SCHEDULER_OWNER}` user unless --owner names another
(e.g. an API client, so its runs show in that client's task list).

Schedules declared in code (define_workflow(..., schedule=...)) are written by
`migrate` and by --sync; here they can only be paused (--disable) or resumed.

examples:
  manage.py schedule_workflow demo.echo --name nightly --cron "0 3 * * *" --payload '{{"a": 1}}'
  manage.py schedule_workflow demo.echo --name nightly --missed run_once
  manage.py schedule_workflow --name nightly --disable
  manage.py schedule_workflow --name nightly --delete
  manage.py schedule_workflow --list
"""
        return parser

    def add_arguments(self, parser):
        parser.add_argument("workflow", metavar="NAME", nargs="?",
                            help="registered workflow name (needed to create a schedule)")
        parser.add_argument("--name", help="the schedule's name (part of every key it fires)")
        parser.add_argument("--cron", metavar="EXPR", help="when it fires; see below")
        parser.add_argument("--payload", metavar="JSON|@FILE",
                            help="the payload of every run: a JSON object, @path, or @- for "
                                 "standard input (default {} for a new schedule)")
        parser.add_argument("--missed", choices=MissedPolicy.values,
                            help="missed-slot policy (default skip for a new schedule)")
        parser.add_argument("--owner", metavar="USER",
                            help=f"the user the runs belong to (default: {SCHEDULER_OWNER})")
        state = parser.add_mutually_exclusive_group()
        state.add_argument("--enable", action="store_true", help="resume a paused schedule")
        state.add_argument("--disable", action="store_true", help="pause it (no slot runs)")
        state.add_argument("--delete", action="store_true",
                           help="delete the schedule (the runs it started stay)")
        state.add_argument("--list", action="store_true", help="list every schedule")
        state.add_argument("--sync", action="store_true",
                           help="write the schedules declared in code (migrate does it too)")
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")

    def handle(self, *args, workflow, name, cron, payload, missed, owner, enable, disable,
               delete, list: bool, sync, json: bool, **options):
        self.as_json = json
        try:
            if list:
                return self._list()
            if sync:
                return self._sync()
            if not name:
                raise CommandError("--name is required")
            if delete:
                return self._delete(name, workflow)
            if (enable or disable) and not (workflow or cron or payload or missed or owner):
                schedule = schedule_set_enabled(name=name, enabled=enable)
                return self._report("enabled" if enable else "disabled", schedule)
            return self._save(workflow, name, cron, payload, missed, owner,
                              True if enable else False if disable else None)
        except PilotError as exc:
            errors = "".join(f"\n  {field}: {' '.join(map(str, msgs))}"
                             for field, msgs in (exc.errors or {}).items())
            raise CommandError(f"refused ({exc.code}): {exc.detail}{errors}") from None

    def _save(self, workflow, name, cron, payload, missed, owner, enabled):
        current = schedule_find(name)
        if current is None:
            missing = [flag for flag, value in (("NAME", workflow), ("--cron", cron))
                       if not value]
            if missing:
                raise CommandError(f"a new schedule needs {' and '.join(missing)}")
        try:
            user = (scheduler_owner_get(owner) if owner or current is None else current.owner)
        except LookupError as exc:
            raise CommandError(f"--owner: {exc}" if owner else str(exc)) from None
        schedule, outcome = schedule_save(
            name=name, workflow=workflow or current.workflow, cron=cron or current.cron,
            payload=read_payload(payload) if payload is not None else
            (current.payload if current else {}),
            owner=user, missed=missed or (current.missed if current else MissedPolicy.SKIP),
            enabled=enabled)
        self._report(outcome, schedule)

    def _delete(self, name, workflow):
        current = schedule_find(name)
        if current is not None and workflow and current.workflow != workflow:
            raise CommandError(f"schedule {name!r} triggers {current.workflow}, not {workflow}; "
                               "nothing deleted")
        schedule_delete(name=name)
        if self.as_json:
            self.stdout.write(json_text({"outcome": "deleted", "name": name}))
        else:
            self.stdout.write(f"deleted: schedule {name} (the runs it started stay)")

    def _report(self, outcome, schedule):
        if self.as_json:
            self.stdout.write(json_text({"outcome": outcome, **_describe(schedule)}))
            return
        next_slot = schedule.next_slot_at.isoformat() if schedule.next_slot_at else "never (paused)"
        self.stdout.write(f"{outcome}: schedule {schedule.name} triggers {schedule.workflow} at "
                          f"{schedule.cron!r} (missed: {schedule.missed}, owner: "
                          f"{schedule.owner.get_username()}); next slot {next_slot}")

    def _list(self):
        rows = [_describe(s) for s in schedules_all()]
        if self.as_json:
            self.stdout.write(json_text(rows))
            return
        if not rows:
            self.stdout.write("no schedules")
        for row in rows:
            state = "enabled" if row["enabled"] else "paused"
            line = (f"{row['name']}: {row['workflow']} at {row['cron']!r}, {state}, missed "
                    f"{row['missed']}, owner {row['owner']}, {row['origin']}; next "
                    f"{row['next_slot_at'] or '-'}, last fired {row['last_fired_slot'] or '-'} "
                    f"({row['fired_count']} runs)")
            if row["last_error"]:
                line += f"\n  last error: {row['last_error']}"
            self.stdout.write(line)

    def _sync(self):
        report = schedules_sync_declared()
        body = {"created": report.created, "updated": report.updated,
                "unchanged": report.unchanged, "deleted": report.deleted,
                "errors": report.errors}
        if self.as_json:
            self.stdout.write(json_text(body))
        else:
            for key in ("created", "updated", "unchanged", "deleted"):
                self.stdout.write(f"{key}: {', '.join(body[key]) or '-'}")
            for schedule, error in report.errors.items():
                self.stdout.write(f"error: {schedule}: {error}")
        if report.errors:
            raise CommandError(f"{len(report.errors)} declared schedule(s) could not be written")


def json_text(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)
