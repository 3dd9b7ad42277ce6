"""rq-mgr, the supervisor (SPEC S2, S7.2, S21).

Modules: `children` (a supervised child's states and restart policy),
`supervisor` (the Manager: pid file, socket, children table, main loop),
`commands` (the S7.2 socket commands), `pidfile` (who holds the root),
`queuedirs` (which directories are queues, trash, a queue's job groups),
`daemon` (the `python -m rq.mgr` entry and the shared start-up of `run`) and
`cli` (the `rq-mgr` command).  It runs queue processes as programs and never
imports rq.queue.
"""
