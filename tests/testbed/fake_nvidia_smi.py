#!/usr/bin/python3
"""Testbed stand-in for ``nvidia-smi`` inside a CT, at /usr/bin/nvidia-smi as the NVIDIA
driver installs it.

It knows the CT's GPU count (/usr/share/nvidia-testbed/gpu-count, written by the testbed)
and answers the queries the project makes, in nvidia-smi's own CSV format:

    nvidia-smi -L
    nvidia-smi --query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader,nounits
    nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits

A process "uses" a GPU while it holds /dev/nvidiaN open (testbed CTs bind /dev/null there),
MIB_PER_HOLDER MiB each. Tests control the rest through /run/nvidia-testbed/state.json:

    {"held_mib": {"5": 30000}, "held_until": 1764560000.0}

is memory the driver still holds on GPU 5 (an exited process's, being freed) until that
time (for ever without held_until). Inside a real LXC CT nvidia-smi often shows host PIDs
or none (PID namespaces); the project never takes those PIDs for CT processes.
"""

import json
import os
import sys
import time

COUNT_FILE = "/usr/share/nvidia-testbed/gpu-count"
STATE_FILE = "/run/nvidia-testbed/state.json"
TOTAL_MIB = 81559  # an H100 80GB HBM3
MIB_PER_HOLDER = 2048  # a CUDA context and some tensors: above the launch's 1024 MiB threshold


def gpu_count():
    with open(COUNT_FILE) as handle:
        return int(handle.read())


def uuid(index):
    return f"GPU-{os.uname().nodename[-8:]:0>8}-0000-4000-8000-{index:012x}"


def holders():
    """{gpu index: [pid, ...]} of the processes holding /dev/nvidiaN."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            suffix = target[len("/dev/nvidia"):] if target.startswith("/dev/nvidia") else ""
            if suffix.isdigit() and int(entry) not in found.get(int(suffix), []):
                found.setdefault(int(suffix), []).append(int(entry))
    return found


def held_by_driver():
    try:
        with open(STATE_FILE) as handle:
            state = json.load(handle)
    except (OSError, ValueError):
        return {}
    until = state.get("held_until")
    if until is not None and time.time() >= float(until):
        return {}
    return {int(k): int(v) for k, v in state.get("held_mib", {}).items()}


def query(fields, rows):
    for row in rows:
        print(", ".join(str(row[f]) for f in fields))


def main(argv):
    count = gpu_count()
    if not argv or argv[0] in ("-L", "--list-gpus"):
        for index in range(count):
            print(f"GPU {index}: NVIDIA H100 80GB HBM3 (UUID: {uuid(index)})")
        return 0
    options = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    if "--format" in options and options["--format"] != "csv,noheader,nounits":
        print(f"testbed nvidia-smi: only --format=csv,noheader,nounits, not {options['--format']}", file=sys.stderr)
        return 2
    using, held = holders(), held_by_driver()
    if "--query-gpu" in options:
        rows = [{"index": i, "uuid": uuid(i), "memory.total": TOTAL_MIB,
                 "memory.used": MIB_PER_HOLDER * len(using.get(i, [])) + held.get(i, 0)}
                for i in range(count)]
        query(options["--query-gpu"].split(","), rows)
        return 0
    if "--query-compute-apps" in options:
        rows = [{"gpu_uuid": uuid(i), "pid": pid, "used_memory": MIB_PER_HOLDER, "process_name": "python3"}
                for i in range(count) for pid in using.get(i, [])]
        query(options["--query-compute-apps"].split(","), rows)
        return 0
    print(f"NVIDIA-SMI testbed stand-in: {count} GPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
