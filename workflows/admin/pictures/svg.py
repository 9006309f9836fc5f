"""A very small SVG writer for server-side pictures (chart, timeline, diagram).

Pictures are drawn on the server so the console needs no script and no CDN.
Every text and attribute goes through `escape`: workflow names, step names and
errors come from users and must never become markup.

Ink, grid lines and backgrounds are CSS classes (console.css), not fixed
colours, so a picture follows the admin's light or dark theme; only the state
colours, which mean the same in both, are written into the SVG.
"""

from __future__ import annotations

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from workflows.rules.states import StepState, TaskState

# One palette for badges, timeline and diagram, so a colour means one state everywhere.
STATE_COLORS: dict[str, str] = {
    TaskState.PENDING: "#6b7280",
    TaskState.RUNNING: "#2563eb",
    TaskState.RETRYING: "#d97706",
    TaskState.WAITING: "#0891b2",
    TaskState.CANCELLING: "#9333ea",
    TaskState.COMPENSATING: "#c026d3",
    TaskState.SUCCEEDED: "#16a34a",
    TaskState.FAILED: "#dc2626",
    TaskState.CANCELLED: "#475569",
}
STEP_COLORS: dict[str, str] = {
    StepState.PENDING: "#9ca3af",
    StepState.RUNNING: "#2563eb",
    StepState.SUCCEEDED: "#16a34a",
    StepState.FAILED: "#dc2626",
    StepState.COMPENSATING: "#c026d3",
    StepState.COMPENSATED: "#0d9488",
    StepState.COMPENSATION_FAILED: "#b91c1c",
    # Not a stored state: a step whose run a cancel stopped (see task_page).
    "cancelled": "#475569",
    # Not a stored state either: a planned step that has not started.
    "planned": "#cbd5e1",
}
# Text tones: CSS classes of console.css, or white on a coloured bar.
TONES = {"ink": "pilot-ink", "muted": "pilot-ink-muted"}


def _attrs(attrs: dict) -> str:
    parts = []
    for name, value in attrs.items():
        if value is None:
            continue
        shown = f"{value:.1f}" if isinstance(value, float) else value
        parts.append(f'{name.rstrip("_").replace("_", "-")}="{escape(str(shown))}"')
    return " ".join(parts)


class Svg:
    """Collects elements; `render()` returns safe markup. Attribute names use
    `_` for `-` (`font_size` -> `font-size`) and a trailing `_` for keywords."""

    def __init__(self, width: float, height: float, *, label: str):
        self.width, self.height, self.label = width, height, label
        self.parts: list[str] = []

    def element(self, tag: str, text: str | None = None, **attrs) -> None:
        if text is None:
            self.parts.append(f"<{tag} {_attrs(attrs)}/>")
        else:
            self.parts.append(f"<{tag} {_attrs(attrs)}>{escape(text)}</{tag}>")

    def rect(self, x, y, w, h, *, title: str | None = None, **attrs) -> None:
        if title is None:
            self.element("rect", x=x, y=y, width=max(w, 0.0), height=h, **attrs)
            return
        self.parts.append(f"<g><title>{escape(title)}</title>")
        self.element("rect", x=x, y=y, width=max(w, 0.0), height=h, **attrs)
        self.parts.append("</g>")

    def text(self, x, y, text: str, *, tone: str = "ink", **attrs) -> None:
        """`tone`: "ink" (the page's text colour), "muted", or "light" (white,
        for text on a coloured bar)."""
        attrs.setdefault("font_size", 11)
        if tone == "light":
            attrs["fill"] = "#ffffff"
        else:
            attrs["class_"] = TONES[tone]
        self.element("text", text, x=x, y=y, **attrs)

    def line(self, x1, y1, x2, y2, **attrs) -> None:
        """A grid or axis line in the theme's hairline colour (or `stroke`)."""
        if "stroke" not in attrs:
            attrs.setdefault("class_", "pilot-grid")
        self.element("line", x1=x1, y1=y1, x2=x2, y2=y2, **attrs)

    def raw(self, markup: str) -> None:
        """Trusted markup built by this module's callers from escaped parts only."""
        self.parts.append(markup)

    def render(self) -> SafeString:
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" class="pilot-svg" role="img" '
                f'viewBox="0 0 {self.width:.0f} {self.height:.0f}" '
                f'width="{self.width:.0f}" height="{self.height:.0f}" '
                f'aria-label="{escape(self.label)}"><title>{escape(self.label)}</title>')
        return mark_safe(head + "".join(self.parts) + "</svg>")  # noqa: S308 - all parts escaped
