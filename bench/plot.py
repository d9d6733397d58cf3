"""A line chart as SVG, written by hand: the benchmark's plot needs no plotting library.

The y axis is logarithmic (convergence spans milliseconds for the floor to minutes for a cold
fleet); the x axis is linear in proxies. Points that are missing (a run that did not converge)
break the line rather than being drawn at zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

COLORS = ("#1f77b4", "#d62728", "#1f77b4", "#d62728", "#2ca02c", "#9467bd")
WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 230, 40, 50


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float | None]]
    dashed: bool = False


@dataclass(frozen=True)
class Goal:
    """A target drawn as a dotted horizontal line."""

    value: float
    label: str


def write_svg(
    path: Path, title: str, x_label: str, y_label: str, series: Sequence[Series], *, goals: Sequence[Goal] = ()
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_svg(title, x_label, y_label, series, goals=goals))


def render_svg(title: str, x_label: str, y_label: str, series: Sequence[Series], goals: Sequence[Goal] = ()) -> str:
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points if y is not None and y > 0] + [g.value for g in goals]
    x_max = max(xs, default=1.0) or 1.0
    lo = math.floor(math.log10(min(ys, default=0.01)))
    hi = math.ceil(math.log10(max(ys, default=1.0)))
    if hi <= lo:
        hi = lo + 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + plot_w * x / x_max

    def py(y: float) -> float:
        return TOP + plot_h * (hi - math.log10(y)) / (hi - lo)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for exp in range(lo, hi + 1):
        y = py(10.0**exp)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_decade(exp)}</text>')
    for x in sorted(set(xs)):
        out.append(f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" y2="{TOP + plot_h}" stroke="#eee"/>')
        out.append(f'<text x="{px(x):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{x:,.0f}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 12}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(
        f'<text transform="translate(16 {TOP + plot_h / 2}) rotate(-90)" text-anchor="middle">{escape(y_label)}</text>'
    )
    for goal in goals:
        y = py(goal.value)
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#888" stroke-dasharray="2 3"/>'
        )
        out.append(
            f'<text x="{LEFT + plot_w - 4}" y="{y - 4:.1f}" text-anchor="end" fill="#555">{escape(goal.label)}</text>'
        )
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        for run in _runs(s.points):
            coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in run)
            out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
            out.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>' for x, y in run)
        ly = TOP + 10 + 20 * i
        lx = LEFT + plot_w + 15
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 24}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 30}" y="{ly + 4}">{escape(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _runs(points: Sequence[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """Consecutive points with a value, so a missing one breaks the line."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in sorted(points, key=lambda p: p[0]):
        if y is None or y <= 0:
            runs.append([])
        else:
            runs[-1].append((x, y))
    return [r for r in runs if r]


def _decade(exp: int) -> str:
    value = 10.0**exp
    return f"{value:g} s"
