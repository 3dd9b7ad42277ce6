"""Server-side SVG charts for the Stats page (issue 5): pure functions from
numbers to SVG markup, no Flask and no IO.

Every chart is one `<svg class="chart">` scaled by its viewBox to the width of
its card, styled by web/static/rq.css (series classes `s-done`, `s-err`,
`s-relayed`, `l-p50` … use the dashboard's state colours).  Every text that
reaches the markup, labels and hover titles alike, goes through
`Markup.format`, so it is HTML-escaped; numbers are formatted here.  Nothing
is fetched from anywhere: the page needs no chart library and no script.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from markupsafe import Markup

WIDTH, HEIGHT = 640, 230
LEFT, RIGHT, TOP, BOTTOM = 56, 14, 12, 40
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
MAX_BAR = 56  # a bar is never wider than this, even for a single hour
MAX_POINTS = 200  # with more hours a line has no dot (and hover title) per hour
X_LABELS = 6  # at most this many time labels under the x axis
EMPTY = Markup('<p class="chart-empty">No data for this chart in the result.</p>')

Format = Callable[[float], str]


@dataclass(frozen=True)
class Series:
    """One stack or line: its CSS class, legend label and one value per x (None = gap)."""
    css: str
    label: str
    values: Sequence[float | None]


# ---------------------------------------------------------------- number formatting

def fmt_seconds(secs: float | None) -> str:
    """`850 ms`, `4.2 s`, `3.5 min`, `2 h`, `1.5 d`; `0` for zero, `–` for no value."""
    if secs is None or not math.isfinite(secs):
        return "–"
    if secs == 0:
        return "0"
    if secs < 1:
        return f"{secs * 1000:.0f} ms"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if secs >= size:
            return f"{trim(secs / size)} {unit}"
    return f"{trim(secs)} s" if secs < 10 else f"{secs:.0f} s"


def trim(value: float) -> str:
    """One decimal, without a trailing `.0`."""
    return f"{value:.1f}".removesuffix(".0")


def fmt_count(n: float | None) -> str:
    if n is None or not math.isfinite(n):
        return "–"
    return f"{n:,.0f}" if float(n).is_integer() or abs(n) >= 100 else f"{n:,.1f}"


def fmt_percent(rate: float | None) -> str:
    """A rate in [0, 1] as a percentage."""
    if rate is None or not math.isfinite(rate):
        return "–"
    if rate == 0:
        return "0 %"
    return f"{rate * 100:.1f} %" if rate < 0.1 else f"{rate * 100:.0f} %"


def fmt_hour(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:00", time.localtime(epoch))


# ---------------------------------------------------------------- scales

TICKS = 4  # grid lines above the zero line
COUNT_STEPS = tuple(m * 10 ** k for k in range(13) for m in (1, 2, 5))
SECOND_STEPS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30,
                60, 120, 300, 600, 900, 1800, 3600, 7200, 3 * 3600, 6 * 3600, 12 * 3600,
                86400, 2 * 86400, 7 * 86400, 14 * 86400, 28 * 86400)


def nice_max(value: float, steps: Sequence[float] = COUNT_STEPS) -> float:
    """The top of an axis at or above `value` whose TICKS grid lines fall on round
    steps (counts: 1, 2, 5 x 10^k; seconds: whole seconds, minutes, hours, days)."""
    if value <= 0 or not math.isfinite(value):
        return float(steps[0] * TICKS)
    step = next((s for s in steps if s * TICKS >= value * (1 - 1e-9)), None)
    if step is None:
        step = math.ceil(value / TICKS / steps[-1]) * steps[-1]
    return float(step * TICKS)


def y_ticks(top: float) -> list[float]:
    return [top * i / TICKS for i in range(TICKS + 1)]


def y_pos(value: float, top: float) -> float:
    return TOP + PLOT_H - PLOT_H * min(max(value, 0.0), top) / top


def x_label_indexes(n: int) -> list[int]:
    if n <= X_LABELS:
        return list(range(n))
    step = math.ceil(n / X_LABELS)
    return list(range(0, n, step))


def time_label(epoch: float, hours: Sequence[float]) -> str:
    """`HH:00` when every hour falls on one day, else `MM-DD HH:00`."""
    same_day = time.localtime(hours[0])[:3] == time.localtime(hours[-1])[:3]
    return time.strftime("%H:00" if same_day else "%m-%d %H:00", time.localtime(epoch))


# ---------------------------------------------------------------- pieces

def frame(label: str, top: float, fmt_y: Format, body: Markup, x_axis: Markup) -> Markup:
    """The <svg> around a plot: grid lines with y labels, the body, the x axis."""
    grid = Markup("").join(
        Markup('<line class="grid" x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}"/>'
               '<text class="y" x="{}" y="{:.1f}">{}</text>').format(
            LEFT, WIDTH - RIGHT, y_pos(v, top), y_pos(v, top), LEFT - 6, y_pos(v, top) + 4,
            fmt_y(v))
        for v in y_ticks(top))
    return Markup('<svg class="chart" viewBox="0 0 {} {}" role="img" aria-label="{}" '
                  'preserveAspectRatio="xMidYMid meet">{}{}{}'
                  '<line class="axis" x1="{}" x2="{}" y1="{}" y2="{}"/></svg>').format(
        WIDTH, HEIGHT, label, grid, body, x_axis, LEFT, WIDTH - RIGHT, TOP + PLOT_H,
        TOP + PLOT_H)


def time_axis(hours: Sequence[float], slot: float) -> Markup:
    parts = []
    for i in x_label_indexes(len(hours)):
        x = LEFT + slot * (i + 0.5)
        parts.append(Markup('<text class="x" x="{:.1f}" y="{}">{}</text>').format(
            x, HEIGHT - BOTTOM + 16, time_label(hours[i], hours)))
    return Markup("").join(parts)


def legend(series: Sequence[Series]) -> Markup:
    items = Markup("").join(Markup('<li><span class="key {}"></span>{}</li>').format(s.css, s.label)
                            for s in series)
    return Markup('<ul class="legend">{}</ul>').format(items)


# ---------------------------------------------------------------- charts

def stacked_bars(hours: Sequence[float], series: Sequence[Series], label: str,
                 fmt_y: Format = fmt_count) -> Markup:
    """One bar per hour, the series stacked bottom-up in order."""
    totals = [sum(s.values[i] or 0 for s in series) for i in range(len(hours))]
    if not hours or not any(totals):
        return EMPTY
    top = nice_max(max(totals))
    slot = PLOT_W / len(hours)
    width = min(max(slot * 0.8, 0.5), MAX_BAR)
    bars = []
    for i, hour in enumerate(hours):
        base = 0.0
        x = LEFT + slot * i + (slot - width) / 2
        for s in series:
            value = s.values[i] or 0
            if value <= 0:
                continue
            y_top, y_bottom = y_pos(base + value, top), y_pos(base, top)
            bars.append(Markup('<rect class="{}" x="{:.2f}" y="{:.2f}" width="{:.2f}" '
                               'height="{:.2f}"><title>{} · {} {}</title></rect>').format(
                s.css, x, y_top, width, y_bottom - y_top, fmt_hour(hour), fmt_y(value),
                s.label))
            base += value
    return frame(label, top, fmt_y, Markup("").join(bars), time_axis(hours, slot)) + \
        legend(series)


def line_chart(hours: Sequence[float], series: Sequence[Series], label: str,
               fmt_y: Format = fmt_seconds, top: float | None = None) -> Markup:
    """One line per series over the hours; a None value breaks the line."""
    values = [v for s in series for v in s.values if v is not None and math.isfinite(v)]
    if not hours or not values:
        return EMPTY
    if top is None:
        top = nice_max(max(values), SECOND_STEPS if fmt_y is fmt_seconds else COUNT_STEPS)
    slot = PLOT_W / len(hours)
    lines: list[Markup] = []
    points: list[Markup] = []
    for s in series:
        for run in point_runs(s.values):
            xy = [(LEFT + slot * (i + 0.5), y_pos(v, top)) for i, v in run]
            if len(run) > 1:
                lines.append(Markup('<polyline class="{}" points="{}"/>').format(
                    s.css, " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)))
            if len(run) == 1 or len(hours) <= MAX_POINTS:
                points.extend(Markup('<circle class="{}" cx="{:.1f}" cy="{:.1f}" r="2.6">'
                                     '<title>{} · {} {}</title></circle>').format(
                    s.css, x, y, fmt_hour(hours[i]), s.label, fmt_y(v))
                    for (i, v), (x, y) in zip(run, xy, strict=True))
    return frame(label, top, fmt_y, Markup("").join(lines + points), time_axis(hours, slot)) + \
        legend(series)


def point_runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """(index, value) runs between the gaps (None) of a series."""
    runs: list[list[tuple[int, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None or not math.isfinite(v):
            runs.append([])
        else:
            runs[-1].append((i, v))
    return [run for run in runs if run]


def histogram(edges: Sequence[float], counts: Sequence[int], label: str) -> Markup:
    """Bars for the bins [edges[i], edges[i+1]); the last bin is open."""
    if not counts or not any(counts):
        return EMPTY
    top = nice_max(max(counts))
    slot = PLOT_W / len(counts)
    width = min(slot * 0.84, MAX_BAR)
    body, axis = [], []
    for i, n in enumerate(counts):
        x = LEFT + slot * i + (slot - width) / 2
        y = y_pos(n, top)
        if n > 0:
            body.append(Markup('<rect class="s-wait" x="{:.2f}" y="{:.2f}" width="{:.2f}" '
                               'height="{:.2f}"><title>wait {} · {} messages</title></rect>'
                               ).format(x, y, width, TOP + PLOT_H - y, bin_range(edges, i),
                                        fmt_count(n)))
        axis.append(Markup('<text class="x" x="{:.1f}" y="{}">{}</text>').format(
            LEFT + slot * (i + 0.5), HEIGHT - BOTTOM + 16, bin_label(edges, i)))
    return frame(label, top, fmt_count, Markup("").join(body), Markup("").join(axis))


def bin_label(edges: Sequence[float], i: int) -> str:
    """A short name of bin i: `< 10 ms` for the first bin from 0, `≥ 1 h` for the
    open last bin, else its lower bound `1 s+`; bin_range gives the full range."""
    if i + 1 >= len(edges):
        return f"≥ {fmt_seconds(edges[i])}"
    if i == 0 and edges[0] == 0:
        return f"< {fmt_seconds(edges[1])}"
    return f"{fmt_seconds(edges[i])}+"


def bin_range(edges: Sequence[float], i: int) -> str:
    """`10 ms – 100 ms`, or `≥ 1 h` for the open last bin."""
    if i + 1 >= len(edges):
        return f"≥ {fmt_seconds(edges[i])}"
    return f"{fmt_seconds(edges[i])} – {fmt_seconds(edges[i + 1])}"
