"""Builtin queue scripts (SPEC S12): relay, webhook and cleaner.

Each is a standalone program that `rq-install` (S20) configures as the `script` of the queue of
the same name and runs with RQ's own interpreter.  They import nothing of `rq`, so they also run
by hand (`python rq/builtin/cleaner.py` with RQ_ROOT and RQ_PARAM1 set).
"""
