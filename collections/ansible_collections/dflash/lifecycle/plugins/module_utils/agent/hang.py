# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A hung run (Python 3.8 compatible, the standard library only): its diagnostics kept before it is
stopped (each process's threads, state and wchan, its Python stacks with native frames by py-spy,
nvidia-smi), and its stop made a hang's - each stage before the last waiting no longer than the
run's longest interval, no checkpoint required - with what that stop kept or lost in words.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import write_atomic


DIAGNOSTICS_KEPT = 10


# a hang's stop: the wait of each stage before the last, at least this, else the run's longest interval
HANG_GRACE_FLOOR_S = 3.0


HANG_GRACE_UNKNOWN_S = 30.0  # a run that showed no interval yet


def diagnostics(directory, launch, stop, main_pid):
    """A hung run's threads (state, wchan) and Python stacks with native frames (py-spy dump
    --native) for each of its processes, and nvidia-smi, kept in <directory>/diagnostics/ (the
    newest DIAGNOSTICS_KEPT). Returns the path."""
    import subprocess

    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import ladder, stop_options

    options = stop_options.StopOptions(stop)
    main = proctable.read_process(main_pid)
    processes = proctable.run_processes(main, proctable.snapshot()) if main else []
    found = [dict(ladder.diagnostics(p.identity, options, "/proc", native=True), cmdline=p.cmdline[:300])
             for p in processes]
    report = {"at": time.time(), "processes": found}
    smi = launch.get("nvidia_smi") or "/usr/bin/nvidia-smi"
    try:
        ran = subprocess.run([smi], capture_output=True, text=True, timeout=10, check=False)
        report["nvidia_smi"] = (ran.stdout + ran.stderr)[-8000:]
    except (OSError, subprocess.TimeoutExpired) as err:
        report["nvidia_smi"] = f"{smi}: {err}"
    folder = os.path.join(directory, "diagnostics")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-hang.json")
    write_atomic(path, json.dumps(report, indent=1))
    for old in sorted(os.listdir(folder))[:-DIAGNOSTICS_KEPT]:
        os.unlink(os.path.join(folder, old))
    return path


def hang_grace(gaps):
    """How long each stage but the last of a hang's stop waits: the run's longest interval (a
    signal that still reaches the trainer has started its save by then), HANG_GRACE_FLOOR_S at
    least; HANG_GRACE_UNKNOWN_S for a run that showed none."""
    return max(HANG_GRACE_FLOOR_S, *gaps) if gaps else HANG_GRACE_UNKNOWN_S


def as_hang(options, grace):
    """The run's stop options (StopOptions) made a hang's: every stage but the last, and the stop
    request's acknowledgement, wait at most grace (the graceful stage still grows while a
    checkpoint is written); no checkpoint is required of it, and a run with no graceful stage is
    stopped at once rather than at its next periodic checkpoint."""
    options.on_missing_checkpoint, options.no_graceful, options.require_checkpoint = "proceed", "proceed", False
    options.request_ack_timeout = min(float(options.request_ack_timeout), grace)
    options.stages = [dict(stage, wait=min(stage["wait"], grace)) for stage in options.stages[:-1]] + options.stages[-1:]
    return options


def loss_words(result):
    """What a stop of the supervisor's kept or lost, from its result's loss (staged_stop's)."""
    loss = result.get("loss") or {}
    if loss.get("saved_on_stop"):
        return "it saved a checkpoint on its stop: 0 steps lost"
    if loss.get("steps_lost") is not None:
        since = f"since {os.path.basename(loss['checkpoint'])}" if loss.get("checkpoint") else "of the run (no checkpoint)"
        return f"no checkpoint from its stop: {loss['steps_lost']} steps {since} lost"
    return "no checkpoint from its stop; the steps lost are not known"
