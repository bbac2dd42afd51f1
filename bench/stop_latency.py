#!/usr/bin/env python3
"""Stop detection latency: trainer exit -> noticed, staged_stop's wait against the hand loop.

A stand-in trainer (a real process, reaped by its own parent as `bash run.sh` would) exits
at a random moment and records the wall-clock time of its exit. Three watchers, run side by
side on the same kind of exits, note when they see it gone:

  pidfd     target_set.Targets.wait_gone (poll() on a pidfd), as the module runs it
  fallback  the same without pidfds (short sleeps), for kernels/Pythons without them
  hand-2s   the hand-written loop: `while kill -0 $PID; do sleep 2; done` in bash

Prints the median and the worst latency of each and the ratio to the hand loop.
Usage: .venv/bin/python bench/stop_latency.py [--runs N]
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import testlib  # noqa: E402,F401  (installs the collection loader)
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import target_set  # noqa: E402

# The parent forks the trainer and reaps it at once; the trainer writes its exit time last.
TRAINER = r"""
import os, sys, time
delay, stamp = float(sys.argv[1]), sys.argv[2]
pid = os.fork()
if pid == 0:
    time.sleep(delay)
    with open(stamp, "w") as f:
        f.write(repr(time.time()))
    os._exit(0)
print(pid, flush=True)
os.waitpid(pid, 0)
"""


def start_trainer(delay, stamp):
    parent = subprocess.Popen([sys.executable, "-c", TRAINER, str(delay), stamp],
                              stdout=subprocess.PIPE, text=True)
    return parent, int(parent.stdout.readline())


def exit_time(stamp):
    with open(stamp, encoding="utf-8") as handle:
        return float(handle.read())


def watch_module(pid, use_pidfd):
    targets = target_set.Targets(use_pidfd=use_pidfd)
    try:
        targets.add(proctable.read_process(pid), "main")
        targets.wait_gone(list(targets.members), timeout=60)
        return time.time()
    finally:
        targets.close()


def watch_hand_loop(pid):
    out = subprocess.run(["bash", "-c", f"while kill -0 {pid} 2>/dev/null; do sleep 2; done; "
                                        "date +%s.%N"], capture_output=True, text=True, check=True)
    return float(out.stdout)


def measure(method, runs, rng):
    latencies = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(runs):
            stamp = os.path.join(tmp, f"{method}-{run}")
            parent, pid = start_trainer(rng.uniform(0.3, 2.5), stamp)
            if method == "hand-2s":
                noticed = watch_hand_loop(pid)
            else:
                noticed = watch_module(pid, use_pidfd=(method == "pidfd"))
            parent.wait()
            latencies.append(noticed - exit_time(stamp))
    return latencies


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    rng = random.Random(1)
    results = {m: measure(m, args.runs, rng) for m in ("pidfd", "fallback", "hand-2s")}
    hand = statistics.median(results["hand-2s"])
    print(f"stop detection latency, {args.runs} runs each (exit -> noticed)")
    print(f"{'watcher':<10} {'median ms':>10} {'max ms':>10} {'vs hand loop':>13}")
    for method, values in results.items():
        med = statistics.median(values)
        print(f"{method:<10} {med * 1000:>10.2f} {max(values) * 1000:>10.2f} "
              f"{med / hand:>12.4f}x")


if __name__ == "__main__":
    main()
