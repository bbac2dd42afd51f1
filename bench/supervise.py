#!/usr/bin/env python3
"""The run's supervisor (module_utils/supervisor.py) on CT 201 of the testbed, the example trainer
launched by redeploy.yml with the supervisor's default policy but for a short back-off and hang
floor (SETTINGS):

- crash: a probe in the CT kills the trainer (SIGKILL) and watches for the new run's first
  progress line; the time between, less the back-off and less the trainer's own start-up (its
  process start to its first progress line, from the launch's record), is the supervisor's own
  cost: finding the exit, the relaunch's checks and staging, the start. REPEAT rounds, medians;
- hang: the probe records when each progress line arrives, stops the trainer (SIGSTOP) right after
  one, and reads when the supervisor declared the hang: that delay against the run's observed
  interval between progress lines (and the timeout the supervisor learned);
- the supervisor's CPU (its utime + stime over WATCH_S seconds of training, per cent of one core)
  and memory (VmRSS) while the run trains.
Needs root; brings the default testbed up. Usage: .venv/bin/python bench/supervise.py
(BENCH_REPEAT=3, BENCH_WATCH_S=30)
"""

import json
import os
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from testlib import END_RUNS, LiveTestbed, testbed_mod, tool_env  # noqa: E402

NODE, VMID, CT = "pve1", "201", "ct201"
BACKOFF_S = 2
SETTINGS = {"trainer_launch_health_seconds": 1, "trainer_launch_supervise_backoff_s": BACKOFF_S,
            "trainer_launch_supervise_hang_floor_s": 5, "trainer_launch_supervise_hang_factor": 3}
REPEAT = int(os.environ.get("BENCH_REPEAT", "3"))
WATCH_S = float(os.environ.get("BENCH_WATCH_S", "30"))
LIFECYCLE = "/var/lib/dflash/lifecycle"

# in the CT: the trainer killed, then the new run's first progress line (its arrival, polled every 10 ms)
CRASH_PROBE = r"""
import json, os, re, signal, time
progress = re.compile(r" step \d+ .*tok/s")
old = int(open("/run/dflash/trainer.pid").read().split()[0])
killed = time.time()
os.kill(old, signal.SIGKILL)
while time.time() - killed < 300:
    try:
        pid = int(open("/run/dflash/trainer.pid").read().split()[0])
        text = open("/workspace/logs/train.log", errors="replace").read() if pid != old else ""
    except (OSError, ValueError, IndexError):
        text = ""
    if f"pid={pid} " in text and progress.search(text[text.find(f"pid={pid} "):]):
        print(json.dumps({"killed": killed, "progress": time.time(), "pid": pid}))
        break
    time.sleep(0.01)
"""

# in the CT: progress lines' arrivals, SIGSTOP right after the eighth, then the supervisor's verdict
HANG_PROBE = r"""
import json, os, re, signal, time
progress = re.compile(rb" step \d+ .*tok/s")
pid = int(open("/run/dflash/trainer.pid").read().split()[0])
log = "/workspace/logs/train.log"
offset, arrivals = os.path.getsize(log), []
while len(arrivals) < 8:
    with open(log, "rb") as handle:
        handle.seek(offset)
        data = handle.read()
    offset += len(data)
    arrivals += [time.time()] * len(progress.findall(data))
    time.sleep(0.01)
os.kill(pid, signal.SIGSTOP)
stopped = time.time()
while time.time() - stopped < 300:
    state = json.load(open("/var/lib/dflash/lifecycle/supervisor.json"))
    end = (state.get("ends") or [{}])[-1]
    if end.get("kind") == "hang" and end.get("at", 0) > stopped:
        print(json.dumps({"arrivals": arrivals, "stopped": stopped, "declared": end["at"], "cause": end["cause"],
                          "timeout_s": state.get("learned", {}).get("timeout_s")}))
        break
    time.sleep(0.05)
"""

USAGE_PROBE = r"""
import json, os, sys, time
pid = int(sys.argv[1])
def cpu():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
began, used = time.time(), cpu()
time.sleep(float(sys.argv[2]))
rss = next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS:"))
print(json.dumps({"cpu_s": cpu() - used, "wall_s": time.time() - began, "rss_kib": rss}))
"""


def in_ct(bed, command, check=True):
    return bed.ssh(NODE, f"pct exec {VMID} -- sh -c {shlex.quote(command)}", check=check, timeout=600).stdout


def probe(bed, script, *args):
    return json.loads(in_ct(bed, f"python3 -c {shlex.quote(script)} {' '.join(args)}").strip().splitlines()[-1])


def watching(bed, timeout=120):
    """The supervisor's state once it watches a healthy run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = json.loads(in_ct(bed, f"cat {LIFECYCLE}/supervisor.json 2>/dev/null || echo {{}}", check=False))
        if state.get("state") == "watching" and state.get("learned", {}).get("timeout_s"):
            return state
        time.sleep(0.5)
    raise AssertionError(f"no supervisor watching within {timeout} s")


def main():
    bed = LiveTestbed(testbed_mod.Testbed(os.path.join(REPO, "inventory", "testbed")))
    subprocess.run(["make", "testbed-up"], cwd=REPO, env=tool_env(), check=True, capture_output=True)
    in_ct(bed, f"{END_RUNS}; rm -rf /workspace/checkpoints {LIFECYCLE}/supervisor.json", check=False)
    for playbook, extra in (("playbooks/testbed_seed.yml", ["-e", f"seed_hosts={CT}"]),
                            ("redeploy.yml", ["-l", CT, "-e", json.dumps(SETTINGS)])):
        done = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), playbook, *extra], cwd=REPO,
                              env=tool_env(), capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout[-3000:]
    try:
        crashes = []
        for _ in range(REPEAT):
            watching(bed)
            seen = probe(bed, CRASH_PROBE)
            record = json.loads(in_ct(bed, "cat /run/dflash/launch.json"))
            state = json.loads(in_ct(bed, f"cat {LIFECYCLE}/supervisor.json"))
            total = seen["progress"] - seen["killed"]
            # the back-off doubles with each restart within the window: the one this restart waited
            crashes.append({"total": total, "found": state["ends"][-1]["at"] - seen["killed"], "backoff": state["backoff_s"],
                            "startup": record["first_progress_s"],
                            "ours": total - state["backoff_s"] - record["first_progress_s"]})
        state = watching(bed)
        usage = probe(bed, USAGE_PROBE, str(state["supervisor"]), str(WATCH_S))
        hang = probe(bed, HANG_PROBE)
    finally:
        in_ct(bed, END_RUNS, check=False)

    def median(key):
        return statistics.median(c[key] for c in crashes)

    print(f"supervisor, CT {VMID} of the testbed, example trainer; medians of {REPEAT} rounds")
    print(f"  crash (SIGKILL) -> new run's first progress line   {median('total'):6.2f} s")
    print(f"    of it: the back-off (doubling from {BACKOFF_S} s)          {median('backoff'):6.2f} s")
    print(f"    of it: the trainer's own start-up               {median('startup'):6.2f} s")
    print(f"    ours (the rest)                                 {median('ours'):6.2f} s   (goal < 1 s)")
    print(f"    the exit found after                            {median('found'):6.3f} s")
    gaps = [b - a for a, b in zip(hang["arrivals"], hang["arrivals"][1:])]
    interval = statistics.median(gaps)
    delay = hang["declared"] - hang["arrivals"][-1]
    print(f"  hang (SIGSTOP after a progress line): observed interval {interval:.2f} s (longest {max(gaps):.2f} s), "
          f"learned timeout {hang['timeout_s']:.2f} s")
    print(f"    last progress line -> hang declared             {delay:6.2f} s = {delay / interval:.1f} intervals")
    cpu_pct = 100 * usage["cpu_s"] / usage["wall_s"]
    print(f"  supervisor while the run trains: CPU {usage['cpu_s']:.3f} s in {usage['wall_s']:.1f} s = "
          f"{cpu_pct:.3f}% of a core (goal < 0.1%), RSS {usage['rss_kib'] / 1024:.1f} MiB (goal < 20 MB)")


if __name__ == "__main__":
    main()
