"""The cost of one `rq sendmesg` from a shell (issue 15: at most 2.5x a bare
`python -c pass` of the same interpreter, measured in the same run).

Both commands run as real processes, interleaved, `--n` times each: `python -c
pass` and the `rq` console script of this checkout's virtualenv sending one
durable message to a paused queue.  Printed: the median wall time and CPU
time (user + system of the child, from wait4) of each, and their ratios; then
the rate of a shell loop of `rq sendmesg`.

Both run with their bytecode cached, as after `pip install` of the wheel (which
compiles every module): the children get `PYTHONPYCACHEPREFIX` under the
temporary directory and never `PYTHONDONTWRITEBYTECODE`, and the warm-up runs
fill that cache.  Without it each call also compiles every module it imports
(measured 2026-11-26: 78 ms CPU instead of ~55), a cost no installed `rq` pays.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from common import (
    QUEUE, REPO, QueueProc, add_common_args, bench_queue, disk_probe, machine_line, median,
    new_root, temp_base,
)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run; it must exit 0."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return wall, usage.ru_utime + usage.ru_stime


def shell_loop(command: str, n: int, env: dict[str, str]) -> float:
    """Runs per second of `command` in a /bin/sh loop of `n` runs (each must succeed)."""
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", f"i=0; while [ $i -lt {n} ]; do {command} >/dev/null || exit 1; "
                    "i=$((i+1)); done"], env=env, check=True)
    return n / (time.perf_counter() - t0)


def install_wheel(base: Path) -> str:
    """This checkout built as a wheel (`pip wheel --no-deps`) and installed into a new
    virtualenv under `base`; its dependencies are found in this interpreter's
    site-packages, named by a .pth file after the wheel's own (a plain path line:
    the .pth files there, such as an editable install's finder, are not run).
    Returns the virtualenv's python."""
    import site
    import sysconfig
    wheels, venv = base / "wheel", base / "wheelvenv"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(REPO)], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([*pip, "--python", python, "install", "--no-deps", "--no-index",
                    *map(str, wheels.glob("*.whl"))], check=True, stdout=subprocess.DEVNULL)
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], check=True, capture_output=True, text=True)
    deps = site.getsitepackages() or [sysconfig.get_paths()["purelib"]]
    Path(purelib.stdout.strip(), "zz_rq_bench_deps.pth").write_text("\n".join(deps) + "\n")
    return python


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=30, help="runs of each command")
    ap.add_argument("--compare", metavar="CHECKOUT",
                    help="also time `rq sendmesg` with another checkout's rq package first on "
                         "PYTHONPATH (same interpreter, interleaved): a before/after in one run")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="keep PYTHONDONTWRITEBYTECODE as given: when it is set no cache is "
                         "written, so a module without a __pycache__ entry beside it is compiled "
                         "on every call (how figures before 2026-11-26 were taken, in a checkout "
                         "that had none)")
    ap.add_argument("--wheel", action="store_true",
                    help="time the `rq` of a wheel built from this checkout and installed in a "
                         "throwaway virtualenv (not the editable install of .venv, whose import "
                         "finder costs extra), against that virtualenv's `python -c pass`")
    add_common_args(ap)
    args = ap.parse_args()
    python = sys.executable
    print(f"cli_cost: n={args.n}, {machine_line()}")
    with temp_base(args.tmpdir, args.keep) as base:
        print(f"  {disk_probe(base)}")
        if args.wheel:
            python = install_wheel(base)
        rq = os.path.join(os.path.dirname(python), "rq")
        print(f"  rq: {'a wheel in a throwaway virtualenv' if args.wheel else rq}")
        root = new_root(base, "cli")
        bench_queue(root, num_workers=1, paused=True)
        env = dict(os.environ, RQ_ROOT=str(root))
        if not args.no_bytecode_cache:
            env["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
            env.pop("PYTHONDONTWRITEBYTECODE", None)
        print(f"  bytecode cache: {'off' if env.get('PYTHONDONTWRITEBYTECODE') else 'on'}")
        cases = {"python -c pass": ([python, "-c", "pass"], env),
                 "rq sendmesg": ([rq, "sendmesg", "--dest", QUEUE], env)}
        if args.compare:
            other = dict(env, PYTHONPATH=os.path.abspath(args.compare))
            cases[f"rq sendmesg ({os.path.basename(os.path.abspath(args.compare))})"] = (
                [rq, "sendmesg", "--dest", QUEUE], other)
        times: dict[str, list[tuple[float, float]]] = {label: [] for label in cases}
        with QueueProc(root):
            for argv, case_env in cases.values():  # warm up (and fill the bytecode cache)
                for _ in range(2):
                    timed(argv, case_env)
            for _ in range(args.n):
                for label, (argv, case_env) in cases.items():
                    times[label].append(timed(argv, case_env))
            loop_n = max(10, args.n)
            bare_rate = shell_loop(f'"{python}" -c pass', loop_n, env)
            loop_rate = shell_loop(f'"{rq}" sendmesg --dest {QUEUE}', loop_n, env)
    bw, bc = (median([t[i] for t in times["python -c pass"]]) for i in (0, 1))
    print(f"  {'':34} wall ms   CPU ms   ratio wall, CPU")
    for label, runs in times.items():
        w, c = median([t[0] for t in runs]), median([t[1] for t in runs])
        print(f"  {label:34} {w * 1000:7.1f}  {c * 1000:7.1f}   {w / bw:5.2f}x {c / bc:5.2f}x")
    print("  (target: rq sendmesg <= 2.5x python -c pass)")
    print(f"  shell loop of rq sendmesg: {loop_rate:.1f} msg/s (target >= 40); of python -c "
          f"pass: {bare_rate:.1f}/s, the ceiling of any Python command on this machine now")
    return 0


if __name__ == "__main__":
    sys.exit(main())
