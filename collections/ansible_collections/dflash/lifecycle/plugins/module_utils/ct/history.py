# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the CT keeps of its run's past for its metrics (module_utils/agent/metrics.py), in
``history.json`` of the lifecycle directory (Python 3.8 compatible, the standard library only):

- ``stop``: the last stop that ended a trainer - a job's, the Proxmox hook's, the supervisor's
  hang stop - its duration, the stage that ended it (0: the stop request, 1: the first signal) and
  the steps it lost;
- ``redeploys``: how many launches replaced a running trainer (a redeploy's stop_first), and the
  last one's GPU idle, from the old trainer's first signal to the new one's first progress line;
- ``post_start_at``: when the Proxmox hook's post-start last ran in the CT; with ``pve-hook.json``,
  which ``make pve-hooks`` writes when it sets the hookscript on the CT or takes it off, it tells a
  CT that started since with neither: it runs without the hook.

Only counts and figures, never a setting: the metrics are served to whoever reaches the CT's
port. Bookkeeping never fails the work it records: every writer swallows OSError.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import UnsafePath, read_mapping, secure_dir, write_atomic


def path_of(directory):
    return os.path.join(directory, "history.json")


def read(directory):
    """The record (a dict, {} when there is none or it is unreadable)."""
    return read_mapping(path_of(directory)) or {}


def _update(directory, change):
    if not directory:
        return
    try:  # a CT's first redeploy stops a run no launch of ours kept anything for: its stop counts too
        secure_dir(directory)
    except (OSError, UnsafePath):
        return
    record = read(directory)
    change(record)
    try:
        write_atomic(path_of(directory), json.dumps(record), 0o644)
    except OSError:
        pass


def stop_facts(result, now=None):
    """The figures of a stop's result (staged_stop.run's) that the metrics show, or None when it
    stopped no trainer."""
    if not result.get("changed") or not result.get("targets"):
        return None
    by = result.get("stopped_by") or {}
    stage = None
    if by.get("scope") == "request":
        stage = 0
    elif by.get("stage") is not None:
        stage = by["stage"] + 1
    return {"at": time.time() if now is None else now, "duration_s": result.get("duration_s"), "stage": stage,
            "signal": by.get("signal"), "steps_lost": (result.get("loss") or {}).get("steps_lost"),
            "failed": bool(result.get("failed")) or not result.get("stopped", True)}


def record_stop(directory, result):
    facts = stop_facts(result)
    if facts is not None:
        _update(directory, lambda record: record.update(stop=facts))


def record_redeploy(directory, stop, launch, now=None):
    """A launch that replaced a running trainer (stop: its stop_first's result; launch: the healthy
    launch's, just returned): the count, and the GPU idle from the start of the old trainer's stop
    to the new one's first progress line (first_progress_s and healthy_after_s count from the same moment
    of the launch's health wait, which ended now)."""
    if stop_facts(stop) is None:
        return
    now = time.time() if now is None else now
    signalled, first, healthy = stop.get("started_at"), launch.get("first_progress_s"), launch.get("healthy_after_s")
    idle = round(now - healthy + first - signalled, 3) if None not in (signalled, first, healthy) else None

    def change(record):
        record["redeploys"] = {"count": int((record.get("redeploys") or {}).get("count") or 0) + 1,
                               "at": now, "gpu_idle_s": idle}
    _update(directory, change)


def record_post_start(directory):
    _update(directory, lambda record: record.update(post_start_at=time.time()))


def mark_hook(directory, installed, set_at):
    """What ``make pve-hooks`` did to the CT's hookscript, written to ``pve-hook.json``: the
    lifecycle directory made as a launch makes it (its parents with the defaults, itself root's
    only) and the marker rewritten, so that its modification time is this moment on the node's
    clock. Raises OSError or UnsafePath (a directory that is a symlink, not root's or writable by
    others: refused, never followed)."""
    os.makedirs(os.path.dirname(directory), 0o755, exist_ok=True)
    secure_dir(directory)
    path = os.path.join(directory, "pve-hook.json")
    write_atomic(path, json.dumps({"installed": bool(installed), "set_at": set_at}) + "\n", 0o644)
    return path


def hook_marker(directory):
    """What ``make pve-hooks`` last did to the CT's hookscript ({installed, set_at}), with
    ``written_at``, the file's modification time, or None. ``set_at`` is the controller's clock;
    ``written_at`` is the node's, which the CT's start time and the post-start's record are on, so
    a controller whose clock runs ahead cannot make a start without the hook read as guarded."""
    path = os.path.join(directory, "pve-hook.json")
    marker = read_mapping(path)
    if marker is None:
        return None
    try:
        return dict(marker, written_at=os.stat(path).st_mtime)
    except OSError:
        return None
