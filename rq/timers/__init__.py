"""The timers daemon (SPEC S10): `python -m rq.timers --root ROOT`.

`schedule` holds the pure rules (timer files, due times, state), `daemon` the
loop, the scans, the fires and the small socket the manager forwards its
`timers` / `timers_status` commands to.  Must not import rq.mgr, rq.queue or
rq.scandir: those are programs of their own.
"""
