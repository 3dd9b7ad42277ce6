"""Builtin queue scripts (SPEC S12): relay, webhook and cleaner.

Each is a standalone program that `rq-install` (S20) configures as the `script` of the queue of
the same name and runs with RQ's own interpreter.  They import nothing of `rq` but `jobio`, the
job side they share (log and status lines), which a script run as a file finds next to it; so
they also run by hand (`python rq/builtin/cleaner.py` with RQ_ROOT and RQ_PARAM1 set).
"""
