"""The task page's timeline: the run's phases over time, then one bar per step.

The top lane is the task's phases (workflows/admin/phases.py): each attempt
(`running`), each backoff, each wait for a worker, cancels and restarts in
order. Below it, each step of the plan: its last execution from its
checkpoint, or "not started". Unfinished runs are drawn up to `now`.
"""

from __future__ import annotations

from datetime import datetime

from django.utils.safestring import SafeString

from workflows.admin.phases import BACKOFF, PARKED, WAIT_OR_BACKOFF, WAITING
from workflows.admin.pictures.svg import STATE_COLORS, STEP_COLORS, Svg
from workflows.admin.text import duration_text, seconds_text
from workflows.rules.states import TaskState

WIDTH = 860
LABEL_W = 130
LANE_H, GAP = 18, 6
TOP = 8
# A wait for a worker is drawn in the pending grey, a backoff in the retrying amber.
PHASE_COLORS = {WAITING: STATE_COLORS[TaskState.PENDING],
                BACKOFF: STATE_COLORS[TaskState.RETRYING],
                WAIT_OR_BACKOFF: STATE_COLORS[TaskState.RETRYING],
                PARKED: STATE_COLORS[TaskState.WAITING]}
PHASE_LABELS = {WAITING: "waiting", BACKOFF: "backoff", WAIT_OR_BACKOFF: "retrying",
                PARKED: "parked"}


def task_timeline(task, phases: list, steps: list, *, now: datetime) -> SafeString:
    """SVG of `task`'s run: `phases` in order, `steps` (StepView) by index."""
    step_ends = [s.finished_at or (now if s.started_at else None) for s in steps]
    end = max([phases[-1].end, *[e for e in step_ends if e]])
    start = task.created_at
    span = max((end - start).total_seconds(), 0.001)
    plot_w = WIDTH - LABEL_W - 10
    height = TOP + (1 + len(steps)) * (LANE_H + GAP) + 26
    svg = Svg(WIDTH, height, label=f"Timeline of task {task.pk}")

    def x_of(ts: datetime) -> float:
        return LABEL_W + plot_w * (ts - start).total_seconds() / span

    y = TOP
    svg.text(4, y + 13, "run", font_weight="bold")
    attempt = 0
    for phase in phases:
        x0, x1 = x_of(phase.start), x_of(phase.end)
        width = max(x1 - x0, 2.0)
        if phase.state == TaskState.RUNNING and phase.how.startswith("claim"):
            attempt += 1
        label = (f"attempt {attempt}" if phase.state == TaskState.RUNNING and attempt
                 else PHASE_LABELS.get(phase.kind, phase.state))
        svg.rect(x0, y, width, LANE_H, rx=2, data_state=phase.state, data_phase=phase.kind,
                 fill=PHASE_COLORS.get(phase.kind, STATE_COLORS.get(phase.state, "#9ca3af")),
                 title=f"{phase.label} ({phase.how}) {seconds_text(phase.seconds)}")
        if width > 6.5 * len(label) + 6:
            svg.text(x0 + 4, y + 13, label, tone="light")
    for step, step_end in zip(steps, step_ends, strict=True):
        y += LANE_H + GAP
        svg.text(4, y + 13, f"{step.index + 1}. {step.name}"[:20])
        if step.started_at is None:
            label = step.label if not step.recorded else f"{step.label}, not started"
            svg.text(LABEL_W + 4, y + 13, label, tone="muted", data_step=step.name)
            continue
        x0 = x_of(step.started_at)
        width = max(x_of(step_end) - x0, 2.0)  # type: ignore[arg-type]  # started: it has an end
        svg.rect(x0, y, width, LANE_H, fill=STEP_COLORS.get(step.state, "#9ca3af"), rx=2,
                 data_step=step.name, data_step_state=step.state,
                 title=f"{step.name}: {step.label}, {step.attempts} attempt(s), "
                       f"{duration_text(step.started_at, step_end)}")
        label = f"{step.label} ×{step.attempts}" if step.attempts > 1 else step.label
        if width > 6.5 * len(label) + 6:
            svg.text(x0 + 4, y + 13, label, tone="light")
    y += LANE_H + GAP + 14
    svg.line(LABEL_W, y - 12, LABEL_W + plot_w, y - 12)
    svg.text(LABEL_W, y, f"{start:%Y-%m-%dT%H:%M:%S}Z", tone="muted")
    svg.text(LABEL_W + plot_w, y, f"+{duration_text(start, end)}"
             + ("" if task.finished_at else " (now)"), text_anchor="end", tone="muted")
    return svg.render()
