"""RQ: a Unix job-queue daemon that keeps every message as a directory on disk.

The package is split by ownership (see docs/DESIGN.md): leaves (`errors`,
`protocol`, `message`) never do IO; `fsops` is the only seam for spool file
operations; `store` is the only code that renames message directories; `proc`
is the only code that spawns, signals and reaps.
"""

__version__ = "0.1.0"
