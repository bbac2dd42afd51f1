#!/usr/bin/env python3
"""Redeploy cost, scale and check-mode cost, measured side by side on a testbed of its own.

Brings up a bench testbed (2 nodes x 4 CTs on 127.77.3.x, state in
/var/lib/dflash-testbed/bench), seeds every CT with a running trainer, then prints:

1. Redeploy cost per CT: pct invocations, SSH connections (sshd's own log) and Ansible tasks
   for a no-change and a one-file-change redeploy, beside the hand-written sequence (scp to
   the node, pct push, py_compile, pgrep -af, kill -INT, a 2 s kill -0 poll loop, relaunch);
   and the redeploy's own overhead (wall time minus the trainer's checkpoint and start-up
   time up to its first progress line, which the redeploy reports) as a ratio to the hand
   sequence's wall time.
3. Scale: wall time of one redeploy batch over 1, 2, 4 and 8 CTs (2 nodes), ratio to 1 CT,
   with the machine's CPU seconds, the floor they set on a machine of this many CPUs, and how
   busy the machine's CPUs were over the run (the higher, the more the batch waits for CPU
   rather than for one round trip after another).
4. Check mode: wall time of `--check` against the real no-change run.
Every figure is the median of BENCH_REPEAT (default 5) runs. (Table 2, stop detection latency,
is bench/stop_latency.py.)

The trainer prints its progress line every profile_interval steps, counted from step 0, so how
long a relaunched trainer takes to its first progress line depends on the step it was stopped
at: anywhere from one step to a whole period. Runs repeated back to back would stop it at much
the same point of its period each time (and a faster redeploy would move that point). So every
measured run starts after a pause drawn at random (seeded) within one period: one CT waits
for one random draw, a batch of eight for the slowest of eight, as in real use. The scale table
also shows the slowest CT's own time and the ratio of the rest.
The bench testbed is taken down at the end. Usage: .venv/bin/python bench/redeploy_bench.py
"""

import glob
import importlib.util
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from testlib import BIN, TRAINER, LiveTestbed, make_testbed_inventory, testbed_mod, tool_env  # noqa: E402

import hand  # noqa: E402  (bench/hand.py: the hand procedure)

STATE = "/var/lib/dflash-testbed/bench"
NODES = {"bn1": "127.77.3.1", "bn2": "127.77.3.2"}
REPEAT = int(os.environ.get("BENCH_REPEAT", "5"))  # runs per figure; the median is printed
CTS = {f"bct{vmid}": (node, vmid) for node, base in (("bn1", 700), ("bn2", 800))
       for vmid in (base, base + 1, base + 2, base + 3)}


def progress_period(inventory):
    """Seconds between two progress lines of the example trainer with the inventory's settings."""
    spec = importlib.util.spec_from_file_location("example_trainer", TRAINER)
    trainer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trainer)
    run_vars = os.path.join(inventory, "group_vars", "dflash_trainers", "run.yml")
    with open(run_vars, encoding="utf-8") as handle:
        interval = int(re.search(r"^dflash_profile_interval:\s*(\d+)", handle.read(), re.M).group(1))
    return interval * trainer.DEFAULT_STEP_SECONDS


def make_inventory(root):
    return make_testbed_inventory(root, STATE, NODES, {h: {"pve_node": n, "ansible_pct_vmid": v}
                                                  for h, (n, v) in CTS.items()})


class Bench:
    def __init__(self, inventory):
        self.inventory = inventory
        self.bed = testbed_mod.Testbed(inventory)
        self.live = LiveTestbed(self.bed)
        self.period = progress_period(inventory)
        self.phase = random.Random(7)  # the pauses before the runs, the same in every bench

    def counts(self):
        """pct calls, SSH connections (TCP + handshake) and SSH sessions (round trips)."""
        pct = sum(len(self.live.pct_invocations(n)) for n in NODES)
        ssh = sessions = 0
        for node in NODES:
            with open(os.path.join(self.bed.node_dir(node), "sshd.log"), encoding="utf-8") as h:
                for line in h:
                    ssh += "Accepted publickey" in line
                    sessions += "Starting session" in line
        return pct, ssh, sessions

    def playbook(self, *args):
        began = time.monotonic()
        res = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", self.inventory, *args],
                             cwd=REPO, env=tool_env(), capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"{args} failed:\n{res.stdout[-3000:]}")
        return res, time.monotonic() - began

    def measured(self, *args):
        time.sleep(self.phase.uniform(0, self.period))  # see the module docstring
        pct0, ssh0, ses0 = self.counts()
        cpu0, controller0, cts0 = cpu_seconds(), controller_seconds(), ct_seconds()
        res, wall = self.playbook(*args)
        cpu = cpu_seconds() - cpu0
        controller, cts = controller_seconds() - controller0, ct_seconds() - cts0
        pct1, ssh1, ses1 = self.counts()
        recap = [line for line in res.stdout.splitlines() if " : ok=" in line]
        tasks = sum(int(line.split("ok=")[1].split()[0]) + int(line.split("skipped=")[1].split()[0])
                    for line in recap)
        return {"pct": pct1 - pct0, "ssh": ssh1 - ssh0, "sessions": ses1 - ses0, "tasks": tasks,
                "wall": wall, "cpu": cpu, "controller": controller, "cts": cts, "stdout": res.stdout}

    def hand_sequence(self, host, src_file):
        node, vmid = CTS[host]
        pct0, ssh0, ses0 = self.counts()
        began = time.monotonic()
        hand.redeploy_by_hand(self.bed, NODES[node], vmid, src_file)
        wall = time.monotonic() - began
        pct1, ssh1, ses1 = self.counts()
        return {"pct": pct1 - pct0, "ssh": ssh1 - ssh0, "sessions": ses1 - ses0, "tasks": "-",
                "wall": wall}


def cpu_seconds():
    """CPU time of the whole machine so far (user, nice, system, irq, softirq; every process:
    controller, sshd, pct, the modules in the CTs and the trainers)."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = handle.readline().split()[1:]
    return sum(int(fields[i]) for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")


def controller_seconds():
    """CPU time of this process's waited-for children: ansible-playbook, its worker processes
    and their ssh clients."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ct_seconds():
    """CPU time spent inside the bench's CTs (modules, their shells, the trainers), from each
    CT's cgroup: cgroup v2's cpu.stat (pure or hybrid layout), else v1's cpuacct."""
    total = 0.0
    for _node, vmid in CTS.values():
        v2 = glob.glob(f"/sys/fs/cgroup/lxc.payload.{vmid}/cpu.stat") + glob.glob(
            f"/sys/fs/cgroup/unified/lxc.payload.{vmid}/cpu.stat")
        if v2:
            with open(v2[0], encoding="ascii") as handle:
                total += int(dict(line.split() for line in handle)["usage_usec"]) / 1e6
            continue
        for usage in glob.glob(f"/sys/fs/cgroup/cpuacct/lxc.payload.{vmid}/cpuacct.usage"):
            with open(usage, encoding="ascii") as handle:
                total += int(handle.read()) / 1e9
    return total


def trainer_times(stdout):
    """{CT: seconds the trainer itself took}, as the redeploy reports them: its checkpoint at
    the stop plus its start-up until its first progress line. Any health hold after that line
    (trainer_launch_health_seconds) is the redeploy's own time."""
    # the callback folds long lines: any run of white space may be a line break
    times = {host: float(stop) + float(start) for host, stop, start in re.findall(
        r"(\w+): release (?:(?!\w+: release ).)*?stopped\s+by\s+\w+\s+in\s+([0-9.]+)s"
        r"(?:(?!\w+: release ).)*?first\s+progress\s+after\s+([0-9.]+)s",
        stdout, re.S)}
    if not times:
        raise SystemExit(f"the redeploy did not report its stop and start-up times:\n{stdout[-2000:]}")
    return times


def trainer_time(stdout):
    """The slowest CT's own time: the one a batch waits for."""
    return max(trainer_times(stdout).values())


def main():
    with tempfile.TemporaryDirectory() as tmp:
        inventory = make_inventory(os.path.join(tmp, "inventory"))
        bench = Bench(inventory)
        bench.bed.up_fresh()
        try:
            run(bench, tmp)
        finally:
            bench.bed.down()


def median(rows, key):
    """The middle run by key (its counts and times stay together)."""
    return sorted(rows, key=key)[len(rows) // 2]


def overhead(row):
    return row["wall"] - trainer_time(row["stdout"])


def run(bench, tmp):
    seed = os.path.join(REPO, "playbooks", "testbed_seed.yml")
    bench.playbook(seed, "-e", "seed_hosts=dflash_trainers")
    one = "bct700"
    bench.playbook("redeploy.yml", "-l", "dflash_trainers", "-e", "redeploy_serial=8")  # releases in
    src = os.path.join(tmp, "src")
    os.makedirs(src)
    shutil.copy(TRAINER, src)
    changed_file = os.path.join(src, "train_dflash_pipeline.py")

    def change(label):
        with open(changed_file, "a", encoding="utf-8") as handle:
            handle.write(f"\n# {label}\n")

    # interleaved, so that the machine's slow moments fall on every kind of run alike
    no_change, one_file, hand = [], [], []
    for attempt in range(REPEAT):
        no_change.append(bench.measured("redeploy.yml", "-l", one, "-e", f"trainer_code_src={src}"))
        change(f"one line changed, run {attempt}")
        one_file.append(bench.measured("redeploy.yml", "-l", one, "-e", f"trainer_code_src={src}"))
        hand.append(bench.hand_sequence(one, changed_file))

    print(f"1. redeploy cost per CT (one CT; the median of {REPEAT} runs each, interleaved; counts from")
    print("   the pct log and sshd's log; the ControlMaster of the run before is reused: new TCP")
    print("   connections only when it expired)")
    print(f"{'run':<24} {'pct calls':>9} {'ssh conns':>9} {'sessions':>8} {'tasks':>6} {'wall s':>7} "
          f"{'trainer s':>9} {'overhead s':>10} {'vs hand':>8}")
    hand_row = median(hand, key=lambda r: r["wall"])
    for name, rows in (("redeploy, no change", no_change), ("redeploy, one file", one_file)):
        row = median(rows, key=overhead)
        print(f"{name:<24} {row['pct']:>9} {row['ssh']:>9} {row['sessions']:>8} {row['tasks']:>6} "
              f"{row['wall']:>7.1f} {trainer_time(row['stdout']):>9.1f} {overhead(row):>10.1f} "
              f"{overhead(row) / hand_row['wall']:>7.2f}x")
    print(f"{'hand sequence':<24} {hand_row['pct']:>9} {hand_row['ssh']:>9} {hand_row['sessions']:>8} "
          f"{hand_row['tasks']:>6} {hand_row['wall']:>7.1f} {'':>9} {hand_row['wall']:>10.1f} {1:>7.2f}x")

    cpus = os.cpu_count()
    print(f"\n3. scale: one batch (serial = N) over 2 nodes, a code change each time, the median of "
          f"{REPEAT} runs ({cpus} CPUs).")
    print("   slowest trainer: the slowest CT's own time (checkpoint + start-up to its first progress")
    print("   line), which the batch waits for; the rest is the redeploy's. CPU floor: the machine's CPU")
    print("   seconds of the run divided by its CPUs, as a ratio to the 1-CT wall time. CPUs busy: those")
    print("   CPU seconds over CPUs x wall time, every process of the machine. Where the CPU")
    print("   went: the controller (ansible-playbook, its workers, ssh), inside the CTs (cgroups: the")
    print("   modules, their shells, the trainers) and the rest (the nodes' sshd, pct, lxc-attach, ...)")
    print(f"{'CTs':>4} {'wall s':>7} {'ratio to 1':>10} {'slowest trainer s':>17} {'rest s':>6} "
          f"{'rest ratio':>10} {'CPU s (machine)':>15} {'CPU s per CT':>12} {'CPU floor':>9} {'CPUs busy':>9} "
          f"{'controller':>10} {'in CTs':>6} {'rest':>5}")
    base = None
    for count, hosts in ((1, ["bct700"]), (2, ["bct700", "bct800"]),
                         (4, ["bct700", "bct701", "bct800", "bct801"]), (8, list(CTS))):
        rows = []
        for attempt in range(REPEAT):
            change(f"scale run {count}.{attempt}")
            rows.append(bench.measured("redeploy.yml", "-l", ",".join(hosts), "-e", f"redeploy_serial={count}",
                                       "-e", f"trainer_code_src={src}"))
        row = median(rows, key=lambda r: r["wall"])
        base = base or row
        print(f"{count:>4} {row['wall']:>7.1f} {row['wall'] / base['wall']:>10.2f} "
              f"{trainer_time(row['stdout']):>17.1f} {overhead(row):>6.1f} {overhead(row) / overhead(base):>10.2f} "
              f"{row['cpu']:>15.1f} {row['cpu'] / count:>12.2f} {row['cpu'] / cpus / base['wall']:>9.2f} "
              f"{row['cpu'] / cpus / row['wall']:>8.0%} "
              f"{row['controller']:>10.1f} {row['cts']:>6.1f} {row['cpu'] - row['controller'] - row['cts']:>5.1f}")

    checks, reals = [], []
    for _attempt in range(REPEAT):
        checks.append(bench.measured("redeploy.yml", "-l", one, "-e", f"trainer_code_src={src}", "--check"))
        reals.append(bench.measured("redeploy.yml", "-l", one, "-e", f"trainer_code_src={src}"))
    check = median(checks, key=lambda r: r["wall"])
    real = median(reals, key=lambda r: r["wall"])
    print(f"\n4. check mode against a real run (one CT, same code, the median of {REPEAT} each)")
    print(f"{'run':<12} {'wall s':>7} {'ratio':>6}")
    print(f"{'real':<12} {real['wall']:>7.1f} {1:>6.2f}")
    print(f"{'--check':<12} {check['wall']:>7.1f} {check['wall'] / real['wall']:>6.2f}")


if __name__ == "__main__":
    main()
