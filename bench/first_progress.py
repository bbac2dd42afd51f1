#!/usr/bin/env python3
"""Time to the new run's first progress line: `make restart` against the hand procedure, side by
side in one run, on a testbed of its own (one node on 127.77.6.1, one CT, state in
/var/lib/dflash-testbed/firstprogress), the release installed already (the code does not change).

The hand procedure is bench/hand.py's: scp, pct push, py_compile, pgrep, kill -INT, a 2 s kill -0
poll (the field's loop), the relaunch. Both are watched from the host the same way, every 10 ms:
the trainer's log in the CT's root file system, and the trainer's processes in /proc (a CT's
processes are the host's too). For each run it prints:

- first progress: from the start of the command to the new run's first progress line;
- the command's wall time, and what comes after that line (`make restart`'s health window,
  trainer_launch_health_seconds, and its report);
- the GPU idle time, from the old trainer's answer to SIGINT ("KeyboardInterrupt at step", the
  moment it stops training) to the new run's first progress line, in three parts: the save (until
  the old trainer's process is gone), the handoff (until the new trainer's process starts: all of
  the tool's own work in between) and the start-up (until its first progress line);
- the stop's own overhead and the preflight's, from the playbook's task times
  (bench/callback_plugins/task_seconds.py): a stop task's wall time less the trainer's save, or,
  where the stop runs in the launch's call, the time from that task's start to the trainer's
  answer to SIGINT plus the handoff; the preflight task's wall time. Where the preflight's own
  call stops and launches (a CT that runs alone, nothing to push or stage: the bench's case), the
  preflight is the time from that task's start to the stop's first signal (the call's way in, its
  checks and the stop's look before it signals) and the stop's overhead is the handoff;
- tasks run and pct calls.

The trainer logs a progress line every profile_interval steps, counted from step 0: with the
testbed's 50 (2.5 s) the first line of a resumed run comes anywhere from one step to a whole
period after its start, noise larger than the figures compared. The bench's CTs log every step
(dflash_profile_interval 1), so a run's first progress line is its first step. Every figure is the
median of BENCH_REPEAT (default 5) runs of each kind, interleaved. The testbed is taken down at
the end.
Usage: .venv/bin/python bench/first_progress.py
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from testlib import BIN, LiveTestbed, make_testbed_inventory, testbed_mod, tool_env  # noqa: E402

import hand  # noqa: E402  (bench/hand.py)

STATE = "/var/lib/dflash-testbed/firstprogress"
NODE, ADDRESS, CT, VMID = "fn1", "127.77.6.1", "fct950", "950"
REPEAT = int(os.environ.get("BENCH_REPEAT", "5"))
TRAINER_PATTERN = "train_dflash_pipeline.py"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def boot_time():
    """The wall-clock moment of boot, to the clock's resolution: a process's start in /proc is
    counted in ticks since boot, and /proc/stat's btime is whole seconds, which would shift every
    start by up to a second against the times the watch reads by the wall clock."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


BOOT = boot_time()


def trainer_processes(vmid):
    """{host PID: start (epoch seconds)} of the trainers running in CT vmid (its cgroup)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
            if not any(TRAINER_PATTERN.encode() in arg for arg in argv[1:3]) or b"python" not in argv[0]:
                continue
            with open(f"/proc/{entry}/cgroup", encoding="ascii") as handle:
                if f"lxc.payload.{vmid}" not in handle.read():
                    continue
            with open(f"/proc/{entry}/stat", encoding="ascii") as handle:
                ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        except (OSError, ValueError, IndexError):
            continue
        found[int(entry)] = BOOT + ticks / CLOCK_TICKS
    return found


class Watch(threading.Thread):
    """Times, by the host's clock, of what one redeploy does to the trainer of the CT: the old
    trainer's answer to SIGINT and its exit, the new trainer's start and its first progress line.
    Follows the log across the launch's rotation (train.log -> train.log.1): the file it has
    open is read to its end before the new one."""

    def __init__(self, log_path, vmid):
        super().__init__(daemon=True)
        self.log_path, self.vmid = log_path, vmid
        self.old = trainer_processes(vmid)
        assert len(self.old) == 1, f"not one trainer in CT {vmid}: {self.old}"
        self.handle = open(log_path, "rb")  # noqa: SIM115 - read until the watch ends
        self.handle.seek(0, os.SEEK_END)
        self.times = {"answer": None, "exit": None, "start": None, "first": None}
        self.pending = b""
        self.done = threading.Event()
        self.quit = threading.Event()

    def lines(self):
        data = self.handle.read()
        if not data:
            try:
                rotated = os.stat(self.log_path).st_ino != os.fstat(self.handle.fileno()).st_ino
            except FileNotFoundError:
                rotated = False
            if rotated:
                self.handle.close()
                self.handle = open(self.log_path, "rb")  # noqa: SIM115
                data = self.handle.read()
        data = self.pending + data
        *complete, self.pending = data.split(b"\n")
        return [line.decode("utf-8", "replace") for line in complete]

    def run(self):
        while not self.quit.is_set() and not self.done.is_set():
            now = time.time()
            for line in self.lines():
                if self.times["answer"] is None and "KeyboardInterrupt at step" in line:
                    self.times["answer"] = now
                elif self.times["start"] is not None and self.times["first"] is None and "tok/s" in line:
                    self.times["first"] = now
                    self.done.set()
            running = trainer_processes(self.vmid)
            if self.times["exit"] is None and not set(self.old) & set(running):
                self.times["exit"] = now
            new = {pid: start for pid, start in running.items() if pid not in self.old}
            if self.times["start"] is None and new:
                self.times["start"] = min(new.values())
            time.sleep(0.01)
        self.handle.close()


class Bench:
    def __init__(self, root):
        self.inventory = make_testbed_inventory(
            os.path.join(root, "inventory"), STATE, {NODE: ADDRESS},
            {CT: {"pve_node": NODE, "ansible_pct_vmid": int(VMID)}}, settings={"dflash_profile_interval": 1})
        self.bed = testbed_mod.Testbed(self.inventory)
        self.live = LiveTestbed(self.bed)
        self.log_path = os.path.join(self.bed.node_dir(NODE), "lxc", VMID, "rootfs", hand.LOG.lstrip("/"))
        self.task_file = os.path.join(root, "tasks.jsonl")
        self.env = dict(tool_env(), DFLASH_BENCH_TASK_SECONDS=self.task_file,
                        ANSIBLE_CALLBACK_PLUGINS=os.path.join(REPO, "bench", "callback_plugins"),
                        ANSIBLE_CALLBACKS_ENABLED="task_seconds")

    def playbook(self, *args):
        subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", self.inventory, *args], cwd=REPO,
                       env=tool_env(), check=True, capture_output=True)

    def measured(self, kind, src_file):
        if os.path.exists(self.task_file):
            os.unlink(self.task_file)
        pct0 = len(self.live.pct_invocations(NODE))
        watch = Watch(self.log_path, VMID)
        watch.start()
        began = time.time()
        if kind == "make restart":
            res = subprocess.run(["make", "restart", f"HOST={CT}", f"INVENTORY={self.inventory}"], cwd=REPO,
                                 env=self.env, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise SystemExit(f"make restart failed:\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}")
        else:
            hand.redeploy_by_hand(self.bed, ADDRESS, VMID, src_file)
        ended = time.time()
        if not watch.done.wait(60):
            watch.quit.set()
            raise SystemExit(f"{kind}: no first progress line of the new run within 60 s: {watch.times}")
        watch.join()
        t = watch.times
        row = {"kind": kind, "wall": ended - began, "first": t["first"] - began,
               "after_first": ended - t["first"] if kind == "make restart" else None,
               "idle": t["first"] - t["answer"], "save": t["exit"] - t["answer"],
               "handoff": t["start"] - t["exit"], "startup": t["first"] - t["start"],
               "pct": len(self.live.pct_invocations(NODE)) - pct0, "tasks": None, "stop_overhead": None,
               "preflight": None}
        if kind == "make restart":
            with open(self.task_file, encoding="utf-8") as handle:
                tasks = [json.loads(line) for line in handle]
            row["tasks"] = sum(1 for task in tasks if task["status"] == "done")
            by_name = {task["task"].split(" : ", 1)[-1]: task for task in tasks}  # less the role
            seconds = {name: task["seconds"] for name, task in by_name.items()}
            preflight = by_name["Check GPUs, model, data, disk and the installed trainer in the CT"]
            row["preflight"] = preflight["seconds"]
            if by_name["Start the trainer and wait until it is healthy"]["status"] == "skipped":
                # the preflight's call stopped and launched: its way to the stop's signal, then the handoff
                row["preflight"] = preflight["stop_signalled_at"] - preflight["began_at"]
                row["stop_overhead"] = row["handoff"]
            elif by_name["Stop the trainer in stages"]["status"] == "skipped":
                # the stop ran in the launch's call: its part is the way to the signal and the handoff
                launch_began = by_name["Start the trainer and wait until it is healthy"]["began_at"]
                row["stop_overhead"] = t["answer"] - launch_began + row["handoff"]
            else:
                row["stop_overhead"] = seconds["Stop the trainer in stages"] - row["save"]
        return row


def median(rows, key):
    values = [row[key] for row in rows if row[key] is not None]
    return statistics.median(values) if values else None


def main():
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(tmp)
        bench.bed.up_fresh()
        try:
            run(bench, tmp)
        finally:
            bench.bed.down()


def run(bench, tmp):
    bench.playbook(os.path.join(REPO, "playbooks", "testbed_seed.yml"), "-e", f"seed_hosts={CT}")
    bench.playbook("redeploy.yml", "-l", CT)  # the release installed, the run under the project
    src = os.path.join(tmp, "train_dflash_pipeline.py")
    with open(os.path.join(REPO, "tests", "testbed", "example_trainer", "train_dflash_pipeline.py"),
              encoding="utf-8") as handle, open(src, "w", encoding="utf-8") as out:
        out.write(handle.read())
    rows = {"make restart": [], "hand procedure": []}
    for _attempt in range(REPEAT):
        for kind in rows:  # interleaved: the machine's slow moments fall on both alike
            rows[kind].append(bench.measured(kind, src))
    hand_first = median(rows["hand procedure"], "first")
    print(f"time to the new run's first progress line, one CT, the median of {REPEAT} runs each, interleaved")
    print(f"(seconds; GPU idle = save + handoff + start-up, from the old trainer's answer to SIGINT)")
    print(f"{'run':<16} {'first progress':>14} {'vs hand':>7} {'wall':>6} {'after first':>11} {'GPU idle':>8} "
          f"{'save':>6} {'handoff':>7} {'start-up':>8} {'stop overhead':>13} {'preflight':>9} {'tasks':>5} {'pct':>4}")
    for kind, kind_rows in rows.items():
        def fmt(key, width, rows=kind_rows):
            value = median(rows, key)
            return f"{'-':>{width}}" if value is None else f"{value:>{width}.{0 if key in ('tasks', 'pct') else 2}f}"
        print(f"{kind:<16} {fmt('first', 14)} {median(kind_rows, 'first') / hand_first:>6.2f}x {fmt('wall', 6)} "
              f"{fmt('after_first', 11)} {fmt('idle', 8)} {fmt('save', 6)} {fmt('handoff', 7)} {fmt('startup', 8)} "
              f"{fmt('stop_overhead', 13)} {fmt('preflight', 9)} {fmt('tasks', 5)} {fmt('pct', 4)}")
    print("each run: " + "; ".join(
        f"{kind}: " + ", ".join(f"{row['first']:.2f}" for row in kind_rows) for kind, kind_rows in rows.items()))


if __name__ == "__main__":
    main()
