#!/usr/bin/env python3
"""Proxmox's own stop and start of a CT with the project's hookscript, against the same without it,
side by side in each round, on CT 201 of the testbed (the example trainer, its model staged from a
persistent copy on the CT's disk; hookscript installed with `make pve-hooks`).

Per round:
- hooked: `pct shutdown` (its wall), then `pct start` (its wall: post-start returns at once) and
  the time from the start to the relaunched run's first progress line, resumed from the stop's
  checkpoint. The pre-stop's own account (/var/lib/dflash/lifecycle/pre-stop.json) gives the
  trainer's own save: its first signal to its exit, checkpoint written in between.
- plain: the hookscript taken off, `pct shutdown` (the trainer killed without a checkpoint) and
  `pct start` (nothing comes back); then the hookscript set again and the run started with
  `make start`, for the next round.

Prints the medians of REPEAT rounds:
  pre-stop overhead beyond the trainer's save = hooked shutdown - plain shutdown - the save
  start -> first progress, and the part of it that is ours: less the trainer's own start-up
  (its process start to its first progress line, from the launch's record)
Needs root; brings the default testbed up (and leaves it as it found it).
Usage: .venv/bin/python bench/pve_hooks.py   (BENCH_REPEAT=3)
"""

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from testlib import LiveTestbed, testbed_mod, tool_env  # noqa: E402

NODE, VMID, CT = "pve1", "201", "ct201"
TARGET, SOURCE = "/dev/shm/models/target", "/workspace/models/target"
SETTINGS = {"trainer_model_stage": {TARGET: SOURCE}, "trainer_model_stage_reserve_gb": 0.05,
            "trainer_run_min_free_gb": 0.1, "trainer_launch_health_seconds": 1}
REPEAT = int(os.environ.get("BENCH_REPEAT", "3"))
PROGRESS = re.compile(r"^(\S+ \S+) step \d+ .*tok/s", re.M)


def in_ct(bed, command, check=True):
    return bed.ssh(NODE, f"pct exec {VMID} -- sh -c {shlex.quote(command)}", check=check, timeout=600).stdout


def make(*args):
    extra = f"EXTRA=-e {shlex.quote(json.dumps(SETTINGS))}"
    done = subprocess.run(["make", *args, f"HOST={CT}", extra], cwd=REPO, env=tool_env(), capture_output=True,
                          text=True, check=False, stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    return done


def timed(bed, command):
    began = time.monotonic()
    done = bed.ssh(NODE, command, check=True, timeout=600)
    return time.monotonic() - began, done.stdout


def wait_progress(bed, marker, began, timeout=120):
    """Seconds from began until the log shows a progress line after marker."""
    while time.monotonic() - began < timeout:
        log = in_ct(bed, "cat /workspace/logs/train.log 2>/dev/null", check=False)
        at = log.rfind(marker) if marker else 0
        if at >= 0 and PROGRESS.search(log[at:]):
            return time.monotonic() - began
        time.sleep(0.1)
    raise AssertionError(f"no progress after {marker!r} within {timeout} s")


def hooked_round(bed):
    wait_progress(bed, "", time.monotonic())
    shutdown_s, said = timed(bed, f"pct shutdown {VMID}")
    assert "0 steps lost" in said, said
    account = json.loads(in_ct_stopped(bed, "/var/lib/dflash/lifecycle/pre-stop.json"))
    signal = next(e for e in account["timeline"] if e["event"] == "signal")
    stopped = next(e for e in account["timeline"] if e["event"] == "stopped")
    checkpoint = account["checkpoint"]["new"]
    began = time.monotonic()
    start_s, _ = timed(bed, f"pct start {VMID}")
    first_s = wait_progress(bed, f"resumed from {checkpoint}", began)
    # the relaunch's record (module_utils/ct/rundir.py), written once it measured the run's throughput
    while not in_ct(bed, "cat /run/dflash/launch.json 2>/dev/null", check=False).strip():
        time.sleep(0.5)
    launch = json.loads(in_ct(bed, "cat /run/dflash/launch.json"))
    return {"shutdown": shutdown_s, "save": stopped["at"] - signal["at"], "start": start_s, "first": first_s,
            "trainer_startup": launch["first_progress_s"]}


def in_ct_stopped(bed, path):
    """A file of the stopped CT, read from its root file system on the node."""
    rootfs = os.path.join(bed.bed.node_dir(NODE), "lxc", VMID, "rootfs")
    with open(os.path.join(rootfs, path.lstrip("/")), encoding="utf-8") as handle:
        return handle.read()


def plain_round(bed):
    hookscript = re.search(r"^hookscript: (.*)$", bed.ssh(NODE, f"pct config {VMID}", check=True).stdout, re.M).group(1)
    bed.ssh(NODE, f"pct set {VMID} --delete hookscript", check=True)
    try:
        wait_progress(bed, "", time.monotonic())
        shutdown_s, _ = timed(bed, f"pct shutdown {VMID}")
        start_s, _ = timed(bed, f"pct start {VMID}")
    finally:
        bed.ssh(NODE, f"pct set {VMID} --hookscript {hookscript}", check=True)
    make("start")
    return {"shutdown": shutdown_s, "start": start_s}


def main():
    bed_obj = testbed_mod.Testbed()
    was_up = bed_obj.running()
    bed_obj.up_fresh(keep_running=True)
    bed = LiveTestbed(bed_obj)
    rows = {"hooked": [], "plain": []}
    try:
        for pid in in_ct(bed, "pgrep -f 'train_dflash_pipeline[.]py' || true").split():
            in_ct(bed, f"kill -KILL {pid}", check=False)
        in_ct(bed, f"mkdir -p {SOURCE} /workspace/data && echo 'a b c d' > /workspace/data/corpus.txt && "
                   f"echo '{{\"model_type\": \"qwen3\"}}' > {SOURCE}/config.json && "
                   f"head -c 64000000 /dev/zero > {SOURCE}/model.safetensors")
        make("restart")
        make("pve-hooks")
        for _ in range(REPEAT):
            rows["hooked"].append(hooked_round(bed))
            rows["plain"].append(plain_round(bed))
    finally:
        bed.ssh(NODE, f"pct set {VMID} --delete hookscript")
        for pid in in_ct(bed, "pgrep -f 'train_dflash_pipeline[.]py' || true", check=False).split():
            in_ct(bed, f"kill -KILL {pid}", check=False)
        in_ct(bed, f"rm -rf {SOURCE} {TARGET}", check=False)
        if not was_up:
            bed_obj.down()

    def median(kind, key):
        return statistics.median(row[key] for row in rows[kind])

    overhead = median("hooked", "shutdown") - median("plain", "shutdown") - median("hooked", "save")
    ours = median("hooked", "first") - median("hooked", "trainer_startup")
    print(f"Proxmox stop and start of CT {VMID} with the hookscript and without, medians of {REPEAT} rounds "
          f"(a 64 MB model restaged)")
    print(f"{'':<58} {'hooked s':>9} {'plain s':>8}")
    print(f"{'pct shutdown (wall)':<58} {median('hooked', 'shutdown'):>9.2f} {median('plain', 'shutdown'):>8.2f}")
    save_words, startup_words = "  of it the trainer's own save (SIGINT -> exit)", "  of it the trainer's own start-up (its start -> first line)"
    print(f"{save_words:<58} {median('hooked', 'save'):>9.2f} {'-':>8}")
    print(f"{'pct start (wall; post-start returns at once)':<58} {median('hooked', 'start'):>9.2f} {median('plain', 'start'):>8.2f}")
    print(f"{'CT start -> first progress line of the resumed run':<58} {median('hooked', 'first'):>9.2f} {'never':>8}")
    print(f"{startup_words:<58} {median('hooked', 'trainer_startup'):>9.2f}")
    print(f"pre-stop overhead beyond the trainer's own save: {overhead:.2f} s; steps lost: 0 hooked, every step since "
          "the last periodic checkpoint plain")
    print(f"CT start -> first progress, less the trainer's own start-up: {ours:.2f} s (restaging, the relaunch, "
          "the post-start hook)")


if __name__ == "__main__":
    main()
