"""The cost of `rq push` and `rq pop` (issue 18) against the `rq` commands a
shell script would use without them, measured in the same run.

One pull queue, its queue process started by hand.  Interleaved, `--n` times
each: `rq push bench` of a 100-byte stdin against `rq sendmesg --dest bench`
(both durable, one process each); then `rq pop bench` against `rq reserve` +
`rq report` (two processes: what a shell consumer needs without pop).  Printed:
median wall and CPU time (user + system of the children, from wait4), the
ratios, and the rate and CPU per message of `rq pop bench --exec cat --loop
--wait 1` draining `--n` pushed messages (one process for all of them).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from common import (
    QUEUE, REPO, ConnectError, add_common_args, client, disk_probe, machine_line, make_queue,
    median, new_root, temp_base, wait_for,
)
from rqtest import free_port

BODY = b"x" * 99 + b"\n"


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv: list[str], env: dict[str, str], data: bytes = b"") -> tuple[float, float, bytes]:
    """(wall s, CPU s of the child, stdout) of one run; it must exit 0.  Only
    this child is reaped meanwhile, so RUSAGE_CHILDREN grows by its CPU."""
    before = children_cpu()
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, input=data, capture_output=True, check=False)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed: {res.stderr.decode()}")
    return wall, children_cpu() - before, res.stdout


def reserve_report(rq: str, env: dict[str, str]) -> tuple[float, float]:
    w1, c1, out = timed([rq, "reserve", "--pattern", QUEUE], env)
    res = json.loads(out.decode()[3:])
    w2, c2, _ = timed([rq, "report", "--msg_id", res["full_msg_id"], "--token", res["token"],
                       "--line", "done ok"], env)
    return w1 + w2, c1 + c2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=30, help="runs of each command")
    add_common_args(ap)
    args = ap.parse_args()
    rq = os.path.join(os.path.dirname(sys.executable), "rq")
    print(f"shell_queue: n={args.n}, {machine_line()}")
    with temp_base(args.tmpdir, args.keep) as base:
        print(f"  {disk_probe(base)}")
        root = new_root(base, "shell")
        set_free_port(root)
        make_queue(root, QUEUE, None, mode="pull", num_workers=4)
        env = dict(os.environ, RQ_ROOT=str(root))
        env["PYTHONPATH"] = str(REPO)
        # reserve/report go through rq-mgr, which also runs the queue process
        mgr_log = open(root / "log" / "mgr.stderr", "ab")
        mgr = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "rq-mgr"), "run"],
                               env=env, stdout=subprocess.DEVNULL, stderr=mgr_log,
                               start_new_session=True)
        try:
            wait_for(lambda: answers(root), 60, "the queue process")
            figures = measure(rq, env, args.n)
        finally:
            mgr.terminate()
            mgr.wait(60)
            mgr_log.close()
    report(figures)
    return 0


def set_free_port(root: Path) -> None:
    path = root / "config" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "port": free_port()}))


def answers(root: Path) -> bool:
    try:
        return client.call_queue(str(root), QUEUE, "ping", timeout=2) == ["pong"]
    except ConnectError:
        return False


def measure(rq: str, env: dict[str, str], n: int) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {"push": [], "send": [], "pop": [], "rr": []}
    for _ in range(2):  # warm up
        timed([rq, "push", QUEUE], env, BODY)
        timed([rq, "pop", QUEUE], env)
    for _ in range(n):
        out["push"].append(timed([rq, "push", QUEUE], env, BODY)[:2])
        out["send"].append(timed([rq, "sendmesg", "--dest", QUEUE], env)[:2])
    for _ in range(n):
        out["pop"].append(timed([rq, "pop", QUEUE], env)[:2])
        out["rr"].append(reserve_report(rq, env))
    for _ in range(n):
        timed([rq, "push", QUEUE], env, BODY)
    before = children_cpu()
    t0 = time.perf_counter()
    subprocess.run([rq, "pop", QUEUE, "--exec", "cat >/dev/null", "--loop", "--wait", "1"],
                   env=env, check=True)
    # wall minus the idle second at the end; CPU includes every `sh -c cat` it ran
    out["loop"] = [(time.perf_counter() - t0 - 1.0, children_cpu() - before)]
    return out


def report(f: dict[str, list[tuple[float, float]]]) -> None:
    def med(key: str) -> tuple[float, float]:
        return median([w for w, _ in f[key]]), median([c for _, c in f[key]])

    print("                               wall ms   CPU ms")
    rows = [("rq push (100 B stdin)", "push"), ("rq sendmesg", "send"),
            ("rq pop", "pop"), ("rq reserve + rq report", "rr")]
    for label, key in rows:
        w, c = med(key)
        print(f"  {label:<28} {w * 1000:7.1f}  {c * 1000:7.1f}")
    for a, b in (("push", "send"), ("pop", "rr")):
        (wa, ca), (wb, cb) = med(a), med(b)
        print(f"  {a} / {'sendmesg' if b == 'send' else 'reserve+report'}: "
              f"{wa / wb:.2f}x wall, {ca / cb:.2f}x CPU")
    n = len(f["push"])
    wall, cpu = f["loop"][0]
    print(f"  rq pop --exec 'cat >/dev/null' --loop, {n} messages in one process: "
          f"{n / wall:.0f} msg/s, {cpu / n * 1000:.1f} CPU ms per message "
          f"({cpu / n / med('pop')[1]:.2f}x one rq pop)")

if __name__ == "__main__":
    sys.exit(main())
