"""Terminal progress of `rq analytics` (issue 19): stage and percent of tasks done.

Owns one background thread that polls Spark's status tracker (`SparkContext.statusTracker()`,
the driver's own view of the running stages: no UI, no listener) twice a second and draws one
tqdm bar on the terminal: the active stages' names, tasks done out of tasks.  It draws only when
the stream is a terminal and the command does not run as a queue's job (RQ_MSG_DIR set, S6: the
builtin `analytics` queue and any queue script): then `progress` is a no-op and the output stays
exactly the three report lines.  `describe` is pure, so the text is tested without Spark.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, TextIO

POLL_S = 0.5


class Stage(NamedTuple):
    stage_id: int
    name: str
    tasks: int
    done: int


def wanted(stream: TextIO, env: Mapping[str, str]) -> bool:
    """Draw only on a terminal, and never as a queue's job."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not env.get("RQ_MSG_DIR")


def screen(stream: TextIO) -> tuple[int, int]:
    """The terminal's (columns, lines); 80x24 where it reports 0 (a pseudo-terminal that was
    never sized does, and tqdm then hides its bar)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return 80, 24
    return size.columns or 80, size.lines or 24


def describe(stages: Sequence[Stage]) -> tuple[str, int, int]:
    """(label, total tasks, tasks done) of the active stages."""
    if not stages:
        return "starting", 0, 0
    ordered = sorted(stages)
    name = ordered[0].name.split(" at ")[0]  # "parquet at NativeMethodAccessorImpl..."
    label = f"stage {ordered[0].stage_id} {name}"
    if len(ordered) > 1:
        label += f" +{len(ordered) - 1}"
    return label, sum(s.tasks for s in ordered), sum(s.done for s in ordered)


def active_stages(tracker: Any) -> list[Stage]:
    found = []
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            found.append(Stage(int(stage_id), str(info.name), int(info.numTasks),
                               int(info.numCompletedTasks)))
    return found


@contextmanager
def progress(spark: Any, stream: TextIO, env: Mapping[str, str]) -> Iterator[None]:
    """Show the job's progress on `stream` while the block runs (when `wanted`)."""
    if not wanted(stream, env):
        yield
        return
    from tqdm import tqdm

    stop = threading.Event()
    cols, lines = screen(stream)
    bar = tqdm(total=0, desc="starting", file=stream, leave=False, ncols=cols, nrows=lines,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n}/{total} tasks [{elapsed}]")
    tracker = spark.sparkContext.statusTracker()

    def poll() -> None:
        while not stop.wait(POLL_S):
            try:
                label, total, done = describe(active_stages(tracker))
            except Exception:  # noqa: BLE001 -- the gateway closing at the end of the run
                return
            bar.set_description_str(label, refresh=False)
            bar.total = max(total, 1)
            bar.n = done
            bar.refresh()

    thread = threading.Thread(target=poll, name="rq-analytics-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.close()
