"""Figures to tables: medians, min–max, ratios and goals, rendered as plain
text (the terminal) and Markdown (bench/results.md). Standard library only."""

from __future__ import annotations

import dataclasses
import statistics

MISSING = "—"


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def number(value, digits: int = 0) -> str:
    if value is None:
        return MISSING
    return f"{value:,.{digits}f}".replace(",", " ")


def spread(values, digits: int = 0) -> str:
    """'median (min–max)', or just the value when there is one."""
    values = [v for v in values if v is not None]
    if not values:
        return MISSING
    if len(values) == 1:
        return number(values[0], digits)
    return (f"{number(statistics.median(values), digits)} "
            f"({number(min(values), digits)}–{number(max(values), digits)})")


def ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def times(value) -> str:
    return MISSING if value is None else f"{value:.2f}×"


@dataclasses.dataclass
class Section:
    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Goal:
    name: str
    figure: str       # the measured value, as shown
    target: str       # what the issue asks
    met: bool | None  # None: not measured (the workload failed or was skipped)

    @property
    def verdict(self) -> str:
        return {True: "met", False: "NOT met", None: "not measured"}[self.met]


def _widths(header, rows):
    return [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]


def render_text(title: str, meta: list[str], sections: list[Section], goals: list[Goal]) -> str:
    out = [title, "=" * len(title), *meta, ""]
    goal_section = Section("Goals (issues 7 and 16)", ["goal", "measured", "target", "verdict"],
                           [[g.name, g.figure, g.target, g.verdict] for g in goals])
    for section in [*sections, goal_section] if goals else sections:
        out += [section.title, "-" * len(section.title)]
        widths = _widths(section.header, section.rows)
        for row in [section.header, *section.rows]:
            out.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True))
                       .rstrip())
        out += [f"  * {n}" for n in section.notes]
        out.append("")
    return "\n".join(out)


def render_markdown(title: str, meta: list[str], sections: list[Section], goals: list[Goal],
                    extra: list[str]) -> str:
    out = [f"# {title}", "", *[f"{m}  " for m in meta], ""]
    goal_rows = [[g.name, g.figure, g.target, f"**{g.verdict}**" if g.met is False
                  else g.verdict] for g in goals]
    goal_section = Section("Goals (issues 7 and 16)", ["goal", "measured", "target", "verdict"],
                           goal_rows)
    for section in [goal_section, *sections] if goals else sections:
        out += [f"## {section.title}", ""]
        out.append("| " + " | ".join(section.header) + " |")
        out.append("|" + "|".join("---" for _ in section.header) + "|")
        out += ["| " + " | ".join(str(c) for c in row) + " |" for row in section.rows]
        if section.notes:
            out.append("")
            out += [f"- {n}" for n in section.notes]
        out.append("")
    return "\n".join([*out, *extra]) + "\n"
