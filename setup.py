"""Build of the optional C helper rq._spawn (rq/_spawn.c); everything else is
in pyproject.toml.  `optional=True`: without a C compiler or Python headers
the install goes on without it and rq.proc starts jobs through /bin/sh."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("rq._spawn", ["rq/_spawn.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra"])])
