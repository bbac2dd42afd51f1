#!/usr/bin/env python3
"""A gang's redeploy against a single CT's, and the gang stop's skew.

A testbed of its own (tests/testlib.py make_gang_inventory): gang dflash_big is ct400 (node gn1)
and ct401 (node gn2), a torchrun agent with 2 CPU ranks each over gloo, one run across both;
ct402 (gn1) runs the same trainer alone (torchrun --standalone, 2 ranks). Each round redeploys
the gang (`redeploy.yml -l dflash_big`, its signal margin measured; again with the 3 s constant
it had before) and the single CT (`-l ct402`), one after the other, and prints side by side per
job: the wall time, the pct invocations per CT (counted by the testbed's pct), the tasks that ran
per CT, and for the gang the stop's skew (the spread of the moments its CTs sent their first
signal), the margin before that moment and how long before it the slowest CT was ready, as the
gang's report says them. The floor: the CPU seconds the machine spent in the job (every process,
from /proc/stat) over its CPUs; the gang against the single CT is printed by wall and by floor.

Then one redeploy of a release whose ranks on node rank 1 (ct401) raise at start-up: the time
from that CT's failed run's last log write (its log set aside as train.log.failed) to the end of
the job, when both CTs run the release of before again from the checkpoint. Goal: 30 s.
Usage: .venv/bin/python bench/gang_redeploy.py [ROUNDS]
"""

import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import testlib  # noqa: E402

STATE = "/var/lib/dflash-testbed/gangbench"
BIN = os.path.join(REPO, ".venv", "bin")


# (job, its row's name, the limit, extra arguments, the VMIDs whose pct calls it counts): the gang with
# its signal margin measured, and with the 3 s constant it had before; the single CT
JOBS = (("gang", "gang dflash_big (ct400 + ct401)", testlib.GANG, (), ("400", "401")),
        ("gang-3s", "the gang, redeploy_gang_signal_margin=3", testlib.GANG,
         ("-e", "redeploy_gang_signal_margin=3"), ("400", "401")),
        ("single", "single CT ct402", "ct402", (), ("402",)))


def cpu_busy_seconds():
    with open("/proc/stat", encoding="utf-8") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def pct_calls(bed):
    found = {}
    for node in bed.nodes:
        path = os.path.join(bed.node_dir(node), "pct-invocations.log")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    argv = json.loads(line)["argv"]
                    if len(argv) > 1:
                        found[argv[1]] = found.get(argv[1], 0) + 1
    return found


def redeploy(inventory, limit, extra=(), fails=False):
    before_cpu, before = cpu_busy_seconds(), time.monotonic()
    res = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inventory, os.path.join(REPO, "redeploy.yml"),
                          "-l", limit, *extra], cwd=REPO, env=testlib.tool_env(), capture_output=True, text=True, check=False)
    wall, cpu = time.monotonic() - before, cpu_busy_seconds() - before_cpu
    if (res.returncode != 0) != fails:
        raise SystemExit(f"redeploy -l {limit} exited {res.returncode}:\n{res.stdout[-5000:]}")
    out = " ".join(res.stdout.split())
    skew = re.search(r"stop signalled together \(skew of the signals sent ([0-9.]+) ms", out)
    margin = re.search(r"; margin ([0-9.]+) s, .*?(?:ready (?:only )?([0-9.]+) s (before|after) the moment)", out)
    tasks = [int(m.group(1)) + int(m.group(2)) for m in re.finditer(r": ok=(\d+)\s+changed=(\d+)", res.stdout)]
    spare = (float(margin.group(2)) * (1 if margin.group(3) == "before" else -1)) if margin else None
    return {"wall": wall, "cpu": cpu, "skew_ms": float(skew.group(1)) if skew else None, "tasks": tasks,
            "margin": (float(margin.group(1)), spare) if margin else None,
            "ended": time.time(), "out": out}


def failed_launch_rollback(inventory, live, root):
    """Seconds from ct401's failed run's last log write to the end of the job that rolled the gang
    back (both CTs running the release of before again), and whether both run."""
    crash = "    corpus = load_corpus(args.data_dir)\n"
    failing = testlib.trainer_source(os.path.join(root, "failing"), lambda t: t.replace(
        crash, crash + '    if os.environ.get("GROUP_RANK") == "1":\n'
                       '        raise RuntimeError("this release fails on node rank 1")\n'))
    done = redeploy(inventory, testlib.GANG, ("-e", json.dumps({"trainer_code_src": failing})), fails=True)
    # the failed run's log: set aside as train.log.failed, or rotated to train.log.N by the relaunch
    find = "stat -c %.9Y $(grep -l 'fails on node rank 1' /workspace/logs/train.log* | head -n 1)"
    last_write = float(live.ssh("gn2", f"pct exec 401 -- sh -c {shlex.quote(find)}", check=True).stdout.strip())
    both = "every CT running" in done["out"] and "rolled back to" in done["out"]
    return done["ended"] - last_write, both


def main(rounds):
    if not os.path.exists(testlib.TORCH_PYTHON):
        raise SystemExit("no torch venv: make venv-torch")
    root = tempfile.mkdtemp(prefix="dflash-gang-bench-")
    inventory = testlib.make_gang_inventory(os.path.join(root, "inventory"), STATE, "127.77.8", "10.77.10", solo=True)
    bed = testlib.testbed_mod.Testbed(inventory)
    live = testlib.LiveTestbed(bed)
    bed.up_fresh()
    try:
        for node, vmid in (("gn1", 400), ("gn2", 401), ("gn1", 402)):
            live.ssh(node, f"pct exec {vmid} -- sh -c 'mkdir -p /dev/shm/models/target /workspace/data && "
                           "echo {} > /dev/shm/models/target/config.json && echo a b c d e f g h > /workspace/data/corpus.txt'",
                     check=True)
        for limit in (testlib.GANG, "ct402"):  # the first launch of each
            redeploy(inventory, limit)
        rows = {job: [] for job, *_ in JOBS}
        calls = {job: [] for job, *_ in JOBS}
        for _ in range(rounds):
            for job, _name, limit, extra, cts in JOBS:
                before = pct_calls(bed)
                rows[job].append(redeploy(inventory, limit, extra))
                after = pct_calls(bed)
                calls[job].append([after.get(v, 0) - before.get(v, 0) for v in cts])
        rollback_s, both_running = failed_launch_rollback(inventory, live, root)
    finally:
        bed.down()
        shutil.rmtree(root, ignore_errors=True)
    cpus = os.cpu_count()
    print(f"{rounds} rounds, {cpus} CPUs; a gang of 2 CTs (2 nodes, 2 ranks each) against one CT (2 ranks)")
    print("| job | wall, median | walls | pct calls per CT | tasks per CT (ok+changed) | CPU floor (CPU s / CPUs) "
          "| stop skew | margin, slowest CT's spare |")
    print("|---|---|---|---|---|---|---|---|")
    for job, name, *_ in JOBS:
        walls = [r["wall"] for r in rows[job]]
        floor = statistics.median(r["cpu"] for r in rows[job]) / cpus
        skews = [r["skew_ms"] for r in rows[job] if r["skew_ms"] is not None]
        print(f"| {name} | {statistics.median(walls):.2f} s | {', '.join(f'{w:.2f}' for w in walls)} | "
              f"{calls[job][-1]} | {rows[job][-1]['tasks']} | {floor:.2f} s | "
              + (f"{', '.join(f'{s:.1f}' for s in skews)} ms" if skews else "-") + " | "
              + (", ".join(f"{r['margin'][0]:.2f} s, {r['margin'][1]:+.2f} s" for r in rows[job] if r["margin"]) or "-")
              + " |")
    single = statistics.median(r["wall"] for r in rows["single"])
    single_floor = statistics.median(r["cpu"] for r in rows["single"])
    for job in ("gang", "gang-3s"):
        print(f"{job} / single CT: wall {statistics.median(r['wall'] for r in rows[job]) / single:.2f}x, "
              f"CPU floor {statistics.median(r['cpu'] for r in rows[job]) / single_floor:.2f}x (goal 1.3x, "
              "judged against the floor's ratio on these CPUs)")
    print(f"a failed gang launch (ct401's ranks raise at start-up): rolled back {rollback_s:.1f} s after its run's "
          f"last log write, both CTs running the release of before again: {'yes' if both_running else 'NO'} "
          "(goal: 30 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
