#!/usr/bin/env python3
"""Staging a model into /dev/shm against the persistent disk's own read rate, side by side.

In CT 201 of the testbed, a model of SHARDS safetensors-sized shards lies on the CT's disk.
Each round, with the page cache of those files dropped first (sync, then
posix_fadvise(DONTNEED) on each, so that both read the disk and not memory):
- the disk's sequential read rate: the files read in order, one stream, in model_stage's block
  size (16 MiB);
- the staging rate: dflash.lifecycle.model_stage, run as the playbooks run it, copying into an
  empty /dev/shm target, as after a CT restart; once verified by names and sizes (the kernel
  copies), once with a sha256sum manifest (Python reads and hashes every byte).
Prints the medians of REPEAT rounds and the ratios; the goal is staging at 0.8x the disk's rate
or better. Needs root; brings the default testbed up (and leaves it as it found it).
Usage: .venv/bin/python bench/model_stage.py   (BENCH_REPEAT=3, BENCH_SHARDS=8, BENCH_SHARD_MB=192)
"""

import json
import os
import shlex
import statistics
import sys
import tempfile

import ansible_runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from testlib import TESTBED_INVENTORY, LiveTestbed, testbed_mod  # noqa: E402

NODE, VMID, CT = "pve1", "201", "ct201"
SOURCE, TARGET = "/workspace/bench-model", "/dev/shm/bench-model"
REPEAT = int(os.environ.get("BENCH_REPEAT", "3"))
SHARDS = int(os.environ.get("BENCH_SHARDS", "8"))
SHARD_MB = int(os.environ.get("BENCH_SHARD_MB", "192"))
BLOCK = 16 * 1024 * 1024  # module_utils/ct/model_stage.py CHUNK

# run in the CT: write the model, or drop its page cache and read it as one stream
MAKE = r"""
import json, os, sys
root, shards, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(root, exist_ok=True)
json.dump({"model_type": "qwen3"}, open(os.path.join(root, "config.json"), "w"))
block = os.urandom(1 << 20)
for i in range(shards):
    with open(os.path.join(root, f"model-{i + 1:05d}-of-{shards:05d}.safetensors"), "wb") as out:
        for _ in range(size >> 20):
            out.write(block)
"""
DROP_AND_READ = r"""
import json, os, sys, time
root, block, read = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "read"
names = sorted(os.listdir(root))
os.sync()
for name in names:
    fd = os.open(os.path.join(root, name), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
total, began = 0, time.monotonic()
for name in names if read else ():
    with open(os.path.join(root, name), "rb", buffering=0) as handle:
        while True:
            chunk = handle.read(block)
            if not chunk:
                break
            total += len(chunk)
seconds = time.monotonic() - began
print(json.dumps({"bytes": total, "seconds": seconds}))
"""


def in_ct(bed, command):
    return bed.ssh(NODE, f"pct exec {VMID} -- sh -c {shlex.quote(command)}", check=True, timeout=600).stdout


def disk_read(bed):
    out = json.loads(in_ct(bed, f"python3 -c {shlex.quote(DROP_AND_READ)} {SOURCE} {BLOCK} read"))
    return out["bytes"] / out["seconds"]


def staging(bed):
    in_ct(bed, f"rm -rf {TARGET} && python3 -c {shlex.quote(DROP_AND_READ)} {SOURCE} {BLOCK} drop")
    with tempfile.TemporaryDirectory() as private:
        run = ansible_runner.run(private_data_dir=private, project_dir=REPO, inventory=TESTBED_INVENTORY,
                                 host_pattern=CT, module="dflash.lifecycle.model_stage", quiet=True,
                                 module_args=json.dumps({"models": {TARGET: SOURCE}, "reserve_gb": 0.1}),
                                 envvars={"ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg")})
        result = next(e["event_data"]["res"] for e in run.events if e["event"] in ("runner_on_ok", "runner_on_failed"))
    (staged,) = result["models"]
    assert staged["state"] == "staged", result
    return staged


def main():
    bed_obj = testbed_mod.Testbed()
    was_up = bed_obj.running()
    bed_obj.up_fresh(keep_running=True)  # a testbed that is up (make demo's) stays as it is
    bed = LiveTestbed(bed_obj)
    rows = {"disk": [], "plain": [], "sha256": []}
    try:
        in_ct(bed, f"rm -rf {SOURCE} {TARGET} && python3 -c {shlex.quote(MAKE)} {SOURCE} {SHARDS} {SHARD_MB << 20}")
        for _ in range(REPEAT):
            rows["disk"].append(disk_read(bed))
            rows["plain"].append(staging(bed))
        in_ct(bed, f"cd {SOURCE} && sha256sum *.safetensors > model.sha256")
        for _ in range(REPEAT):
            rows["sha256"].append(staging(bed))
    finally:
        in_ct(bed, f"rm -rf {SOURCE} {TARGET}")
        if not was_up:
            bed_obj.down()
    disk = statistics.median(rows["disk"])
    print(f"model staging into /dev/shm of CT {VMID}: {SHARDS} shards x {SHARD_MB} MiB = "
          f"{SHARDS * SHARD_MB / 1024:.2f} GiB, page cache dropped before each run, medians of {REPEAT}")
    print(f"{'':<44} {'MB/s':>8} {'x disk':>7} {'streams':>8}")
    print(f"{'disk sequential read (1 stream, 16 MiB blocks)':<44} {disk / 1e6:>8.0f} {1:>7.2f} {1:>8}")
    for key, words in (("plain", "staging, verified by names and sizes"), ("sha256", "staging, verified by SHA-256 too")):
        rate = statistics.median(s["rate"] for s in rows[key])
        print(f"{words:<44} {rate / 1e6:>8.0f} {rate / disk:>7.2f} {rows[key][0]['workers']:>8}")
    print("goal: staging at 0.8x the disk's rate or better")


if __name__ == "__main__":
    main()
