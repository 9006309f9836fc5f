"""The §5 state diagram, drawn from the Task model's own django-fsm transitions.

Edges come from `Task`'s transition metadata, so the picture cannot drift
from the code; only the node positions are laid out here by hand. Operator
edges (those that carry a permission) are dashed and say which permission.
"""

from __future__ import annotations

import math
from collections import defaultdict

from django.utils.html import escape
from django.utils.safestring import SafeString

from workflows.admin.pictures.svg import STATE_COLORS, Svg
from workflows.models import Task
from workflows.rules.states import TaskState as S

WIDTH, HEIGHT = 700, 520
NODE_W, NODE_H = 110, 34

POSITIONS: dict[str, tuple[int, int]] = {
    S.PENDING: (100, 190),
    S.RUNNING: (330, 190),
    S.SUCCEEDED: (580, 70),
    S.FAILED: (580, 190),
    S.RETRYING: (330, 330),
    S.CANCELLING: (580, 330),
    S.CANCELLED: (100, 330),
    S.COMPENSATING: (330, 450),
    S.WAITING: (330, 60),
}

# How far each edge's curve bows (px, to the left of its direction as drawn on
# screen; negative: to the right): opposite edges between two states separate, long edges go
# around the nodes in between.
BENDS: dict[tuple[str, str], int] = {
    (S.RUNNING, S.RETRYING): -34,
    (S.RETRYING, S.RUNNING): -34,
    (S.PENDING, S.RUNNING): -24,   # claim, and release (the workers are stopping) back
    (S.RUNNING, S.PENDING): -24,
    (S.PENDING, S.CANCELLED): -30,
    (S.CANCELLED, S.PENDING): -30,
    (S.CANCELLING, S.CANCELLED): 90,
    (S.FAILED, S.PENDING): -200,
    (S.WAITING, S.CANCELLED): 60,
    (S.WAITING, S.CANCELLING): -60,
}

# Where along its curve (0..1) an edge's label sits, when the middle is crowded.
LABEL_AT: dict[tuple[str, str], float] = {(S.PENDING, S.CANCELLING): 0.75}

def state_edges() -> dict[tuple[str, str], dict]:
    """{(source, target): {"names": [...], "permission": str | None}} from Task's FSM.
    A transition that keeps the state (`resume`, `defer`) is an edge from the
    state to itself."""
    field = Task._meta.get_field("state")
    edges: dict = defaultdict(lambda: {"names": [], "permission": None})
    for t in field.get_all_transitions(Task):
        targets = getattr(t.target, "allowed_states", None) or [t.target or t.source]
        for target in targets:
            edge = edges[(str(t.source), str(target))]
            if t.name not in edge["names"]:
                edge["names"].append(t.name)
            edge["permission"] = edge["permission"] or t.permission
    return dict(edges)


def _clip(cx, cy, tx, ty) -> tuple[float, float]:
    """Where the segment from node centre (cx, cy) towards (tx, ty) leaves the node box."""
    dx, dy = tx - cx, ty - cy
    if dx == 0 and dy == 0:
        return cx, cy
    scale = min((NODE_W / 2 + 3) / abs(dx) if dx else math.inf,
                (NODE_H / 2 + 3) / abs(dy) if dy else math.inf)
    return cx + dx * scale, cy + dy * scale


def state_diagram() -> SafeString:
    svg = Svg(WIDTH, HEIGHT, label="Task state machine")
    svg.raw('<defs><marker id="pilot-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
            'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            '<path d="M0,0 L10,5 L0,10 z" class="pilot-edge-head"/></marker></defs>')
    labels: list[tuple[float, float, str, str]] = []
    for (source, target), edge in sorted(state_edges().items()):
        (x0, y0), (x1, y1) = POSITIONS[source], POSITIONS[target]
        if source == target:  # resume / defer: the state stays, the token moves on
            svg.raw(f'<path d="M{x0 - 22:.1f},{y0 + NODE_H / 2:.1f} C{x0 - 40:.1f},'
                    f'{y0 + NODE_H / 2 + 34:.1f} {x0 + 40:.1f},{y0 + NODE_H / 2 + 34:.1f} '
                    f'{x0 + 22:.1f},{y0 + NODE_H / 2 + 3:.1f}" fill="none" stroke="#374151" '
                    f'stroke-width="1.4" marker-end="url(#pilot-arrow)" '
                    f'data-edge="{escape(source)}-{escape(target)}"/>')
            labels.append((x0, y0 + NODE_H / 2 + 40, " / ".join(edge["names"]), "middle"))
            continue
        length = math.hypot(x1 - x0, y1 - y0)
        bend = BENDS.get((source, target), 0)
        mx, my = (x0 + x1) / 2, (y0 + y1) / 2
        # Control point: the midpoint pushed `bend` px along the left normal.
        qx, qy = mx + bend * (y1 - y0) / length, my - bend * (x1 - x0) / length
        sx, sy = _clip(x0, y0, qx, qy)
        ex, ey = _clip(x1, y1, qx, qy)
        dash = 'stroke-dasharray="5 3" ' if edge["permission"] else ""
        svg.raw(f'<path d="M{sx:.1f},{sy:.1f} Q{qx:.1f},{qy:.1f} {ex:.1f},{ey:.1f}" '
                f'fill="none" class="pilot-edge" stroke-width="1.4" '
                f'{dash}'
                f'marker-end="url(#pilot-arrow)" data-edge="{escape(source)}-{escape(target)}"/>')
        t = LABEL_AT.get((source, target), 0.5)
        lx = (1 - t) ** 2 * sx + 2 * t * (1 - t) * qx + t * t * ex
        ly = (1 - t) ** 2 * sy + 2 * t * (1 - t) * qy + t * t * ey
        # Labels of near-vertical edges sit beside the line, on the side it bows to.
        anchor = "middle"
        if abs(y1 - y0) > abs(x1 - x0):
            anchor = "end" if lx < mx else "start"
            lx += -6 if lx < mx else 6
        labels.append((lx, ly, " / ".join(edge["names"]), anchor))
    for state, (x, y) in POSITIONS.items():
        svg.rect(x - NODE_W / 2, y - NODE_H / 2, NODE_W, NODE_H, rx=17,
                 fill=STATE_COLORS[state], data_node=state)
        svg.text(x, y + 5, state, text_anchor="middle", tone="light", font_size=13,
                 font_weight="bold")
    for lx, ly, text, anchor in labels:
        # A white plate under each label keeps it readable where lines cross.
        width = 6.4 * len(text) + 8
        left = {"middle": lx - width / 2, "start": lx - 4, "end": lx - width + 4}[anchor]
        svg.rect(left, ly - 10, width, 15, class_="pilot-plate", opacity=0.85, rx=3)
        svg.text(lx, ly + 1, text, text_anchor=anchor, font_size=11)
    svg.line(20, HEIGHT - 22, 50, HEIGHT - 22, stroke_dasharray="5 3", class_="pilot-edge")
    svg.text(56, HEIGHT - 18, "operator edges: cancel needs workflows.cancel_task, retry "
                              "needs workflows.retry_task; solid: worker and dispatcher")
    return svg.render()
