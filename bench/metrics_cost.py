#!/usr/bin/env python3
"""What publishing the run's metrics costs in the CT (module_utils/agent/metrics.py; docs/monitoring.md),
beside the run's supervisor alone, on CT 200 of the testbed: the example trainer launched by
redeploy.yml under its supervisor, its metrics served on 0.0.0.0:9733 (the testbed's
trainer_launch_metrics_listen).

- watch: for WATCH_S seconds a probe in the CT scrapes /metrics every SCRAPE_S seconds (15, as the
  documented scrape job does) while the run trains, and reads the CPU time of the exporter and of the
  supervisor (/proc/PID/schedstat: nanoseconds on a CPU, not clock ticks) and their memory (VmRSS);
- burst: SCRAPES scrapes back to back, for the CPU time of one scrape; its cost at one scrape every
  SCRAPE_S seconds is that over SCRAPE_S, plus the exporter's CPU between scrapes.

The probe's own CPU (its requests) is not counted: Prometheus's side of a scrape is Prometheus's.
Needs root; brings the default testbed up. Usage: .venv/bin/python bench/metrics_cost.py
(BENCH_WATCH_S=150, BENCH_SCRAPES=200)
"""

import json
import os
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from testlib import END_RUNS, LiveTestbed, testbed_mod, tool_env  # noqa: E402

NODE, VMID, CT = "pve1", "200", "ct200"
LIFECYCLE = "/var/lib/dflash/lifecycle"
SCRAPE_S = 15.0
WATCH_S = float(os.environ.get("BENCH_WATCH_S", "150"))
SCRAPES = int(os.environ.get("BENCH_SCRAPES", "200"))

PROBE = r"""
import json, os, sys, time, urllib.request
lifecycle, watch_s, every_s, burst = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
exporter = int(open(f"{lifecycle}/metrics.pid").read().split()[0])
supervisor = json.load(open(f"{lifecycle}/supervisor.json"))["supervisor"]
def on_cpu(pid):
    return int(open(f"/proc/{pid}/schedstat").read().split()[0]) / 1e9
def rss(pid):
    return next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS:"))
def scrape():
    return urllib.request.urlopen("http://127.0.0.1:9733/metrics", timeout=10).read()
size = len(scrape())
began, used = time.time(), {pid: on_cpu(pid) for pid in (exporter, supervisor)}
scrapes = 0
while time.time() - began < watch_s:
    scrape()
    scrapes += 1
    time.sleep(max(0.0, began + scrapes * every_s - time.time()))
wall = time.time() - began
watch = {name: {"cpu_s": on_cpu(pid) - used[pid], "rss_kib": rss(pid)}
         for name, pid in (("exporter", exporter), ("supervisor", supervisor))}
at = on_cpu(exporter)
for _ in range(burst):
    scrape()
print(json.dumps({"wall_s": wall, "scrapes": scrapes, "bytes": size, "watch": watch,
                  "per_scrape_ms": (on_cpu(exporter) - at) / burst * 1000}))
"""


def in_ct(bed, command, check=True):
    return bed.ssh(NODE, f"pct exec {VMID} -- sh -c {shlex.quote(command)}", check=check, timeout=900).stdout


def main():
    bed = LiveTestbed(testbed_mod.Testbed(os.path.join(REPO, "inventory", "testbed")))
    subprocess.run(["make", "testbed-up"], cwd=REPO, env=tool_env(), check=True, capture_output=True)
    in_ct(bed, f"{END_RUNS}; rm -rf /workspace/checkpoints {LIFECYCLE}/supervisor.json", check=False)
    for playbook, extra in (("playbooks/testbed_seed.yml", ["-e", f"seed_hosts={CT}"]), ("redeploy.yml", ["-l", CT])):
        done = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), playbook, *extra], cwd=REPO,
                              env=tool_env(), capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout[-3000:]
    try:
        found = json.loads(in_ct(bed, f"python3 -c {shlex.quote(PROBE)} {LIFECYCLE} {WATCH_S} {SCRAPE_S} {SCRAPES}")
                           .strip().splitlines()[-1])
    finally:
        in_ct(bed, END_RUNS, check=False)
    watch = found["watch"]
    share = {name: 100.0 * figures["cpu_s"] / found["wall_s"] for name, figures in watch.items()}
    per_scrape = found["per_scrape_ms"]
    between = watch["exporter"]["cpu_s"] - found["scrapes"] * per_scrape / 1000
    at_15 = 100.0 * (per_scrape / 1000 / SCRAPE_S + max(0.0, between) / found["wall_s"])
    print(f"metrics of CT {VMID}, a scrape every {SCRAPE_S:.0f} s for {found['wall_s']:.0f} s "
          f"({found['scrapes']} scrapes of {found['bytes']} bytes), beside the supervisor alone:")
    print(f"  {'process':<12} {'CPU, % of a core':>17} {'CPU s':>9} {'RSS MiB':>8}")
    for name in ("supervisor", "exporter"):
        print(f"  {name:<12} {share[name]:>16.4f}% {watch[name]['cpu_s']:>9.4f} {watch[name]['rss_kib'] / 1024:>8.1f}")
    print(f"  exporter / supervisor: CPU {share['exporter'] / share['supervisor']:.2f}x, "
          f"RSS {watch['exporter']['rss_kib'] / watch['supervisor']['rss_kib']:.2f}x")
    print(f"  one scrape (a burst of {SCRAPES}): {per_scrape:.2f} ms of CPU; at one scrape every {SCRAPE_S:.0f} s, "
          f"with the {max(0.0, between):.4f} s spent between scrapes: {at_15:.4f}% of a core (goal: under 0.1%)")


if __name__ == "__main__":
    main()
