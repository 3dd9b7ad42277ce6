"""House style gates (STYLE.md "Shape"): ruff on the code, mypy on rq/ and web/."""

from __future__ import annotations

import subprocess
import sys

from rqtest import REPO


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_ruff_clean() -> None:
    dirs = [d for d in ("rq", "tests", "bench", "web") if (REPO / d).is_dir()]
    result = run("ruff", "check", *dirs)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_clean() -> None:
    result = run("mypy", "rq", "web")
    assert result.returncode == 0, result.stdout + result.stderr
