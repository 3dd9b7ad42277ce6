"""The analytics pipeline on PySpark (issue 5): event log (S13) → per-queue metrics.

Modules: `session` (Java check, quiet Spark set-up), `extract` (listing and reading event-log
files), `transform` (pure DataFrame transforms: line checks, messages, aggregates), `summary`
(pure: the JSON of docs/analytics.md), `load` (run directory, atomic publish), `job` (one run,
options and the command glue).  Run it as `rq analytics` or `python -m rq.analytics`.
Only `session`, `extract`, `transform` and `job.run` import pyspark, lazily from `job`.
"""
