# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether the GPUs a run needs are free, and the launch's wait until they are (Python 3.8
compatible).

A stop ends when the run's processes are gone, but the driver frees their GPU memory some
time later (seconds for a 27B model on five GPUs, longer under a CUDA context teardown): a
run started at once dies with CUDA out-of-memory right after the launch said healthy. So the
launch reads, for each GPU it needs, the memory nvidia-smi reports used and the processes
nvidia-smi lists on it, and waits (with a bound) until the memory is below a threshold. A
process of the CT holding the GPU's device file is alive and not the stopped run's: the
launch refuses at once, naming it.

nvidia-smi inside an LXC CT often lists the node's PIDs, or none (the driver sees no PID
namespace): its PIDs are reported as nvidia-smi gives them and never looked up in the CT.
The device-file holders are the CT's own processes, read from its /proc.
"""

from __future__ import annotations

import subprocess
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable

GPU_FIELDS = ("index", "uuid", "memory.used", "memory.total")
APP_FIELDS = ("gpu_uuid", "pid", "used_memory")
POLL_SECONDS = 0.5
QUERY_TIMEOUT = 30


class GpuQueryError(Exception):
    """nvidia-smi could not be run or its answer not read."""


class GpusBusy(Exception):
    def __init__(self, msg, **details):
        super().__init__(msg)
        self.details = details


def _rows(text, fields):
    rows = []
    for line in text.splitlines():
        if not line.strip() or "No running processes" in line:
            continue
        values = [value.strip() for value in line.split(",")]
        if len(values) != len(fields):
            raise GpuQueryError(f"unexpected nvidia-smi line {line!r} (wanted {', '.join(fields)})")
        rows.append(dict(zip(fields, values)))
    return rows


def _mib(value):
    """MiB as an int; None for nvidia-smi's [N/A] or [Not Supported]."""
    try:
        return int(float(value))
    except ValueError:
        return None


def _query(nvidia_smi, option, fields, run):
    argv = [nvidia_smi, f"{option}={','.join(fields)}", "--format=csv,noheader,nounits"]
    try:
        done = run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                   timeout=QUERY_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise GpuQueryError(f"{' '.join(argv)}: {err}") from err
    if done.returncode != 0:
        raise GpuQueryError(f"{' '.join(argv)} exited with status {done.returncode}: "
                            f"{(done.stderr or done.stdout).strip()[:300]}")
    return _rows(done.stdout, fields)


def read_gpus(nvidia_smi, run=subprocess.run):
    """{index: {index, uuid, used_mib, total_mib, apps: [{pid, used_mib}]}} from nvidia-smi."""
    gpus = {}
    for row in _query(nvidia_smi, "--query-gpu", GPU_FIELDS, run):
        gpus[int(row["index"])] = {"index": int(row["index"]), "uuid": row["uuid"],
                                   "used_mib": _mib(row["memory.used"]),
                                   "total_mib": _mib(row["memory.total"]), "apps": []}
    by_uuid = {gpu["uuid"]: gpu for gpu in gpus.values()}
    for row in _query(nvidia_smi, "--query-compute-apps", APP_FIELDS, run):
        gpu = by_uuid.get(row["gpu_uuid"])
        if gpu is not None:
            gpu["apps"].append({"pid": int(row["pid"]), "used_mib": _mib(row["used_memory"])})
    return gpus


def device_holders(device_paths, proc_root="/proc"):
    """{device: [{pid, cmdline}]} of the CT's processes holding a device the run needs."""
    table = proctable.snapshot(proc_root)
    busy = {}
    for path in device_paths:
        for pid in proctable.device_holders(path, table, proc_root):
            busy.setdefault(path, []).append({"pid": pid, "cmdline": table[pid].cmdline[:200]})
    return busy


def not_free(gpus, wanted, threshold_mib):
    """The wanted GPUs whose used memory is above threshold_mib (or unknown), and the wanted
    indexes nvidia-smi does not list."""
    busy, missing = [], []
    for index in wanted:
        gpu = gpus.get(index)
        if gpu is None:
            missing.append(index)
        elif gpu["used_mib"] is None or gpu["used_mib"] > threshold_mib:
            busy.append(gpu)
    return busy, missing


def describe(busy, holders, threshold_mib):
    """One clause per GPU still used and per device file held."""
    parts = []
    for gpu in busy:
        used = "unknown" if gpu["used_mib"] is None else f"{gpu['used_mib']}"
        words = f"GPU {gpu['index']}: {used} of {gpu['total_mib']} MiB used (threshold {threshold_mib} MiB)"
        if gpu["apps"]:
            words += ", nvidia-smi lists " + ", ".join(
                f"PID {app['pid']} ({app['used_mib']} MiB)" for app in gpu["apps"])
        else:
            words += ", no process listed by nvidia-smi (memory of an exited process being freed)"
        parts.append(words)
    for path, procs in sorted(holders.items()):
        parts.append(f"{path} held by " + ", ".join(f"PID {p['pid']} ({p['cmdline'][:80]})" for p in procs))
    return "; ".join(parts)


def wait_free(wanted, threshold_mib, timeout, read=None, holders=None, report=None,
              clock=time.monotonic, sleep=time.sleep):
    """Wait until every wanted GPU uses at most threshold_mib, for at most timeout seconds.
    A CT process holding a device file the run needs is refused at once (a live process of
    another run does not free its memory by being waited for). Returns {waited_s, gpus: {index:
    used_mib}, uuids: {index: uuid}, held_at_start}; GpusBusy naming each GPU, its memory and its holders."""
    read = read or (lambda: {})
    holders = holders or (lambda: {})
    began = clock()
    held_at_start = None
    while True:
        gpus = read()
        busy, missing = not_free(gpus, wanted, threshold_mib)
        if missing:
            raise GpusBusy(f"nvidia-smi does not list GPU {', '.join(map(str, missing))} (it lists "
                           f"{', '.join(map(str, sorted(gpus))) or 'none'}); nothing was started",
                           missing=missing, waited_s=round(clock() - began, 2))
        held = holders()
        words = describe(busy, held, threshold_mib)
        waited = clock() - began
        if held:
            raise GpusBusy(f"GPUs in use by other processes, nothing was started: {words}",
                           waited_s=round(waited, 2), busy=busy, holders=held)
        if held_at_start is None:
            held_at_start = words or None
        if not words:
            return {"waited_s": round(waited, 2), "held_at_start": held_at_start,
                    "gpus": {index: gpus[index]["used_mib"] for index in wanted},
                    "uuids": {index: gpus[index]["uuid"] for index in wanted}}
        if waited >= timeout:
            raise GpusBusy(f"GPUs not free after {waited:.1f}s (bound {timeout}s), nothing was "
                           f"started: {words}", waited_s=round(waited, 2), busy=busy, holders=held)
        if report:
            report(phase="gpus", elapsed=round(waited, 1), bound=timeout, held=words)
        sleep(POLL_SECONDS)
