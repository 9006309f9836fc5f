"""The task page's timeline: the run's states over time, then one bar per step.

The top lane is rebuilt from the audit trail (every TaskTransition starts a new
state segment), so it shows each attempt (`running`), each wait (`retrying`),
cancels and restarts in order. Below it, each step's last execution from its
checkpoint. Unfinished runs are drawn up to `now`.
"""

from __future__ import annotations

from datetime import datetime

from django.utils.safestring import SafeString

from workflows.admin.svg import STATE_COLORS, STEP_COLORS, Svg
from workflows.admin.text import duration_text
from workflows.states import TaskState

WIDTH = 860
LABEL_W = 130
LANE_H, GAP = 18, 6
TOP = 8


def _segments(task, transitions, end: datetime) -> list[tuple[str, datetime, datetime, str]]:
    """(state, start, end, how it began) for each stretch of the task's life."""
    segments = []
    state, since, how = TaskState.PENDING, task.created_at, "created"
    for t in transitions:
        segments.append((state, since, t.at, how))
        state, since, how = t.to_state, t.at, f"{t.transition} by {t.actor}"
    segments.append((state, since, max(end, since), how))
    return segments


def task_timeline(task, transitions: list, steps: list, *, now: datetime) -> SafeString:
    """SVG of `task`'s run: `transitions` oldest first, `steps` by index."""
    end = task.finished_at or now
    step_ends = [s.finished_at or (now if s.started_at else None) for s in steps]
    end = max([end, *[e for e in step_ends if e]])
    start = task.created_at
    span = max((end - start).total_seconds(), 0.001)
    plot_w = WIDTH - LABEL_W - 10
    lanes = 1 + len(steps)
    height = TOP + lanes * (LANE_H + GAP) + 26
    svg = Svg(WIDTH, height, label=f"Timeline of task {task.pk}")

    def x_of(ts: datetime) -> float:
        return LABEL_W + plot_w * (ts - start).total_seconds() / span

    y = TOP
    svg.text(4, y + 13, "run", font_weight="bold")
    attempt = 0
    for state, seg_start, seg_end, how in _segments(task, transitions, end):
        x0, x1 = x_of(seg_start), x_of(seg_end)
        width = max(x1 - x0, 2.0)
        if state == TaskState.RUNNING and how.startswith("claim"):
            attempt += 1
        label = f"attempt {attempt}" if state == TaskState.RUNNING and attempt else state
        svg.rect(x0, y, width, LANE_H, fill=STATE_COLORS.get(state, "#9ca3af"), rx=2,
                 data_state=state,
                 title=f"{state} ({how}) {duration_text(seg_start, seg_end)}")
        if width > 6.5 * len(str(label)) + 6:
            svg.text(x0 + 4, y + 13, str(label), fill="#ffffff")
    for step, step_end in zip(steps, step_ends, strict=True):
        y += LANE_H + GAP
        svg.text(4, y + 13, f"{step.index}. {step.name}"[:20])
        if step.started_at is None:
            svg.text(LABEL_W + 4, y + 13, f"{step.state}, not started", fill="#6b7280")
            continue
        x0 = x_of(step.started_at)
        width = max(x_of(step_end) - x0, 2.0)
        svg.rect(x0, y, width, LANE_H, fill=STEP_COLORS.get(step.state, "#9ca3af"), rx=2,
                 data_step=step.name,
                 title=f"{step.name}: {step.state}, {step.attempts} attempt(s), "
                       f"{duration_text(step.started_at, step_end)}")
        label = f"{step.state} ×{step.attempts}" if step.attempts > 1 else step.state
        if width > 6.5 * len(label) + 6:
            svg.text(x0 + 4, y + 13, label, fill="#ffffff")
    y += LANE_H + GAP + 14
    svg.line(LABEL_W, y - 12, LABEL_W + plot_w, y - 12)
    svg.text(LABEL_W, y, f"{start:%Y-%m-%d %H:%M:%S} UTC", fill="#6b7280")
    svg.text(LABEL_W + plot_w, y, f"+{duration_text(start, end)}"
             + ("" if task.finished_at else " (now)"), text_anchor="end", fill="#6b7280")
    return svg.render()
