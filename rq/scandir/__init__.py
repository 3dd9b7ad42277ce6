"""The scandir daemon (SPEC S11): `python -m rq.scandir --root ROOT`.

`plan` holds the pure rules (entries, the config they stand for, ownership,
what a pass does), `daemon` the loop, the filesystem reads and the manager
requests.  Must not import rq.mgr, rq.queue or rq.timers: those are programs
of their own, reached through their sockets.
"""
