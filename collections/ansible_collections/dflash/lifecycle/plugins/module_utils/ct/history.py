# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the CT keeps of its run's past for its metrics (module_utils/agent/metrics.py), in
``history.json`` of the lifecycle directory (Python 3.8 compatible, the standard library only):

- ``stop``: the last stop that ended a trainer - a job's, the Proxmox hook's, the supervisor's
  hang stop - its duration, the stage that ended it (0: the stop request, 1: the first signal) and
  the steps it lost;
- ``redeploys``: how many launches replaced a running trainer (a redeploy's stop_first), and the
  last one's GPU idle, from the old trainer's first signal to the new one's first progress line;
- ``totals``: what every stop, crash and relaunch cost since the CT first kept a history, by cause
  (CAUSES) - ``steps_lost`` (the steps logged and in no checkpoint) and ``gpu_idle_s`` (from the
  moment the run went down to the next run's first progress line) - counters, kept across launches,
  supervisors and CT restarts;
- ``down``: since when the run is down, and why, until a launch's first progress line ends it;
- ``post_start_at``: when the Proxmox hook's post-start last ran in the CT; with ``pve-hook.json``,
  which ``make pve-hooks`` writes when it sets the hookscript on the CT or takes it off, it tells a
  CT that started since with neither: it runs without the hook.

``tokens.json`` holds the run's tokens: the integral of the trainer's throughput over time, which
the metrics process alone adds to (what it serves as ``dflash_run_tokens_total``).

Only counts and figures, never a setting: the metrics are served to whoever reaches the CT's
port. Bookkeeping never fails the work it records: every writer swallows OSError.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import UnsafePath, guarded, read_mapping, secure_dir, write_atomic


def path_of(directory):
    return os.path.join(directory, "history.json")


def read(directory):
    """The record (a dict, {} when there is none or it is unreadable)."""
    return read_mapping(path_of(directory)) or {}


# why a run went down, what its totals are counted under: a job's stop (make stop, a rollback's),
# a redeploy's, a Proxmox stop, a hang, a gang member's end, a crash
CAUSES = ("redeploy", "stop", "proxmox", "hang", "peer", "crash")
TOKENS = "tokens.json"
# what `make pve-hooks` last did to the CT's hookscript (mark_hook, hook_marker)
HOOK_MARKER = "pve-hook.json"


def _update(directory, change):
    """change(record) applied to the history under its lock (a stop, a launch, the supervisor and
    the hook may write it at once)."""
    if not directory:
        return

    def update():
        record = read(directory)
        change(record)
        write_atomic(path_of(directory), json.dumps(record), 0o644)

    try:  # a CT's first redeploy stops a run no launch of ours kept anything for: its stop counts too
        guarded(path_of(directory), update)
    except (OSError, UnsafePath):
        pass


def _add(record, total, cause, amount):
    totals = record.setdefault("totals", {}).setdefault(total, {})
    totals[cause] = round(float(totals.get(cause) or 0) + amount, 3)


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


def record_stop(directory, result, cause):
    """A stop (result: staged_stop.run's) of cause: the last stop's figures, its steps lost, and,
    when it ended the trainer, the run down from its first signal on."""
    facts = stop_facts(result)
    if facts is None:
        return

    def change(record):
        record["stop"] = facts
        if facts["steps_lost"]:
            _add(record, "steps_lost", cause, facts["steps_lost"])
        if not facts["failed"]:
            record.setdefault("down", {"since": result.get("started_at") or facts["at"], "cause": cause})
    _update(directory, change)


def record_crash(directory, steps_lost, at):
    """The run crashed at at, losing steps_lost (None: not known): the run down from then on."""
    def change(record):
        if steps_lost:
            _add(record, "steps_lost", "crash", steps_lost)
        record.setdefault("down", {"since": at, "cause": "crash"})
    _update(directory, change)


def record_launch(directory, stop, launch, now=None):
    """A healthy launch (launch: its result, just returned; stop: its stop_first's result, or None):
    the GPU idle since the run went down, to the new run's first progress line, added to its cause's
    total (first_progress_s and healthy_after_s count from the same moment of the launch's health
    wait, which ended now); and a launch that replaced a running trainer counted as a redeploy, with
    that idle (from the old trainer's first signal)."""
    now = time.time() if now is None else now
    first, healthy = launch.get("first_progress_s"), launch.get("healthy_after_s")
    first_at = now - healthy + first if None not in (first, healthy) else None

    def change(record):
        down = record.pop("down", None)
        idle = round(first_at - down["since"], 3) if down and first_at is not None else None
        if idle is not None and idle >= 0:
            _add(record, "gpu_idle_s", down.get("cause") or "stop", idle)
        if stop_facts(stop or {}) is not None:
            record["redeploys"] = {"count": int((record.get("redeploys") or {}).get("count") or 0) + 1,
                                   "at": now, "gpu_idle_s": idle}
    _update(directory, change)


def read_tokens(directory):
    """(tokens, at) of tokens.json: the run's tokens so far and when they were last added to."""
    found = read_mapping(os.path.join(directory, TOKENS)) or {}
    try:
        return float(found.get("tokens") or 0), float(found.get("at") or 0)
    except (TypeError, ValueError):
        return 0.0, 0.0


def write_tokens(directory, tokens, at):
    try:
        write_atomic(os.path.join(directory, TOKENS), json.dumps({"tokens": tokens, "at": at}), 0o644)
    except OSError:
        pass


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
    path = os.path.join(directory, HOOK_MARKER)
    write_atomic(path, json.dumps({"installed": bool(installed), "set_at": set_at}) + "\n", 0o644)
    return path


def hook_marker(directory):
    """What ``make pve-hooks`` last did to the CT's hookscript ({installed, set_at}), with
    ``written_at``, the file's modification time, or None. ``set_at`` is the controller's clock;
    ``written_at`` is the node's, which the CT's start time and the post-start's record are on, so
    a controller whose clock runs ahead cannot make a start without the hook read as guarded."""
    path = os.path.join(directory, HOOK_MARKER)
    marker = read_mapping(path)
    if marker is None:
        return None
    try:
        return dict(marker, written_at=os.stat(path).st_mtime)
    except OSError:
        return None
