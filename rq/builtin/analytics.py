#!/usr/bin/env python3
"""The `analytics` builtin queue script (issue 5): runs the PySpark job for its RQ root.

A message `{"dest": "analytics"}` runs `rq analytics` for RQ_ROOT (input ROOT's event log, output
ROOT/analytics/, docs/analytics.md).  Optional: RQ_PARAM1 = `--since`, RQ_PARAM2 = `--until`
(epoch, ISO 8601 or e.g. `24h`).  The queue's `env_vars` may set ANALYTICS_MASTER (default
`local[*]`) and ANALYTICS_CONF (whitespace-separated `key=value` Spark settings).  Like the
other builtin scripts (S12) it logs `<pid> - <time> - <text>` lines to stdout (the job's
stdio.log) and echoes every status line it sends on fd 3: `run …` at the start, then
`done analytics <RUNID>: …` or `fail <one-line reason>` (→ err).  Spark's own output goes to
ROOT/log/analytics-spark.log.  The example timer config/examples/timers/analytics-hourly.json
queues one message an hour.
"""

from __future__ import annotations

import os
import sys

if __package__:  # imported as rq.builtin.analytics
    from rq.builtin import jobio
else:  # run as a file (S12): python put this folder first on sys.path
    import jobio  # type: ignore[no-redef]


def flags_from_env(env: dict[str, str]) -> dict[str, object]:
    flags: dict[str, object] = {}
    for name, var in (("since", "RQ_PARAM1"), ("until", "RQ_PARAM2"),
                      ("master", "ANALYTICS_MASTER")):
        if env.get(var, "").strip():
            flags[name] = env[var].strip()
    conf = env.get("ANALYTICS_CONF", "").split()
    if conf:
        flags["conf"] = conf
    return flags


def main() -> int:
    root = os.environ.get("RQ_ROOT", "")
    if not root:
        jobio.send("fail RQ_ROOT is not set")
        return 0
    flags = flags_from_env(dict(os.environ))
    options = " ".join(f"--{k} {v}" for k, v in flags.items())
    jobio.send(f"run analytics started for {root} {options}".rstrip())
    try:
        from rq.analytics import job
        from rq.errors import RQError

        try:
            final, result = job.execute(root, flags)
        except RQError as exc:
            jobio.send(f"fail {' '.join(str(exc).split())}")
            return 0
        for line in job.report_lines(final, result):
            jobio.log(line)
    except Exception as exc:  # noqa: BLE001 -- the message must end err, with one line
        jobio.send(f"fail analytics failed: {' '.join(str(exc).split())[:400]}")
        return 0
    total = result["total"]
    jobio.send(f"done analytics {result['run_id']}: {total['events']} events, "
         f"{len(result['queues'])} queues, {result['lines']['skipped']} lines skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
