"""The dashboard's activity chart: one line per series over hourly buckets."""

from __future__ import annotations

from django.utils.html import escape
from django.utils.safestring import SafeString

from workflows.admin.pictures.svg import Svg

SERIES = [
    # (attribute of an ActivityBucket, legend, colour)
    ("triggers", "triggers", "#2563eb"),
    ("replays", "replays (duplicates absorbed)", "#9333ea"),
    ("successes", "successes", "#16a34a"),
    ("failures", "failures", "#dc2626"),
    ("retries", "retries", "#d97706"),
]

WIDTH, HEIGHT = 860, 260
LEFT, RIGHT, TOP, BOTTOM = 44, 16, 16, 56


def _nice_max(value: int) -> int:
    """4 × the smallest 1/2/5 × 10^n step that reaches `value`: five round ticks."""
    need = max(-(-value // 4), 1)
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale >= need:
                return 4 * step * scale
        scale *= 10


def activity_chart(buckets: list) -> SafeString:
    """Lines of `buckets` (ActivityBucket, oldest first) as an SVG picture."""
    svg = Svg(WIDTH, HEIGHT, label="Triggers, replays, successes, failures and retries per hour")
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    peak = _nice_max(max((getattr(b, name) for b in buckets for name, _, _ in SERIES),
                         default=0))
    n = max(len(buckets), 2)

    def x_of(i: int) -> float:
        return LEFT + plot_w * i / (n - 1)

    def y_of(value: int) -> float:
        return TOP + plot_h - plot_h * value / peak

    for tick in range(5):
        value = peak * tick // 4
        y = y_of(value)
        svg.line(LEFT, y, LEFT + plot_w, y)
        svg.text(LEFT - 6, y + 4, str(value), text_anchor="end", tone="muted")
    for i, bucket in enumerate(buckets):
        if i % 3 == 0 or i == len(buckets) - 1:
            svg.text(x_of(i), TOP + plot_h + 16, bucket.start.strftime("%H:00"),
                     text_anchor="middle", tone="muted")
    for name, legend, colour in SERIES:
        points = " ".join(f"{x_of(i):.1f},{y_of(getattr(b, name)):.1f}"
                          for i, b in enumerate(buckets))
        svg.element("polyline", points=points, fill="none", stroke=colour, stroke_width=2,
                    data_series=name)
        for i, bucket in enumerate(buckets):
            value = getattr(bucket, name)
            if value:
                svg.raw(f'<circle cx="{x_of(i):.1f}" cy="{y_of(value):.1f}" r="2.5" '
                        f'fill="{colour}"><title>{escape(legend)} '
                        f'{bucket.start:%H:00}: {value}</title></circle>')
    x: float = LEFT
    for _name, legend, colour in SERIES:
        svg.rect(x, HEIGHT - 18, 12, 4, fill=colour)
        svg.text(x + 16, HEIGHT - 13, legend)
        x += 30 + 6.2 * len(legend)
    return svg.render()
