# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's spec on the CT's disk: what the CT needs to stop its run and to bring it back with no
controller (Python 3.8 compatible).

Proxmox stops and starts a CT on its own (a node reboot, ``pct shutdown``/``reboot``, a restart
migration, HA); its hookscript then runs the CT's own hook (module_utils/agent/hook.py). That hook
needs the run's settings when no controller is there, after ``/run`` was wiped by the restart, so
every launch keeps them in the lifecycle directory (``/var/lib/dflash/lifecycle``, on the CT's
disk):

- ``run.json`` (0600: the launch's options hold the run's secrets): the launch's options as they
  started the run, the stop's options, the models to stage, and what is wanted of the run -
  ``running`` since a launch, ``stopped`` since a stop that a person or a job asked for (a failed
  redeploy left down included);
- ``agent.zip``: the code of this collection that the launch ran (module_utils/agent/payload.py
  writes it), so the hook runs what launched the run, never an older copy;
- ``hook``: the one command the node's hookscript runs in the CT,
  ``pct exec <vmid> -- <dir>/hook <phase>``; it names the CT's Python interpreter;
- ``stand-down.json``: written by every stop a person or a job asks for before its first signal,
  so that the run's supervisor (module_utils/agent/supervise.py) never takes that stop for a crash.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import UnsafePath, read_mapping, secure_dir, write_atomic

DEFAULT_DIR = "/var/lib/dflash/lifecycle"
VERSION = 1
# the launch's options that belong to the one launch that had them, not to the run
ONE_LAUNCH_ONLY = ("stop_first", "activate", "gang_stop", "lifecycle", "rollback_launch", "progress_file",
                   "settings_from")
# the stop's options that belong to one job's stop: a gang's moment, the controller's detaching
ONE_STOP_ONLY = ("signal_at",)
# what a spec keeps of the launch before its own (before): what a relaunch of that run needs
RUN_KEYS = ("launch", "stop", "stage_models", "lock_path", "release", "launched_at", "gang_base", "rounds_dir", "round")


def lock_path(spec):
    """The CT's redeploy lock the run's spec names."""
    return spec.get("lock_path") or os.path.join(os.path.dirname(spec["launch"]["pidfile"]), "redeploy.lock")


def spec_path(directory):
    return os.path.join(directory, "run.json")


def read(directory):
    """The spec, or None when the CT has none (no launch by this collection yet) or it cannot be read."""
    spec = read_mapping(spec_path(directory))
    return spec if spec is not None and spec.get("version") == VERSION else None


def _write(directory, spec):
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    try:
        secure_dir(directory)
    except UnsafePath as err:
        raise OSError(str(err)) from None
    write_atomic(spec_path(directory), json.dumps(spec, sort_keys=True))


def _new_rounds(directory, params):
    """The supervisor's rounds of a run a job launched (module_utils/agent/supervise.py): a gang's in
    the checkpoint directory its members share, under the job's own place; a CT alone's in its
    lifecycle directory, the last run's rounds gone."""
    health = params.get("gang_health")
    if health:
        return os.path.join(health["dir"], "supervise")
    rounds = os.path.join(directory, "rounds")
    shutil.rmtree(rounds, ignore_errors=True)
    return rounds


def record_launch(lifecycle, params, pid):
    """After a healthy launch of params (trainer_process's), PID pid: keep the run's spec and the hook
    command in lifecycle["dir"] (the agent beside them: agent/payload.py's write_agent). Raises OSError only."""
    directory = lifecycle["dir"]
    before = read(directory) or {}
    spec = {
        "version": VERSION,
        "launch": {key: value for key, value in params.items() if key not in ONE_LAUNCH_ONLY},
        "stop": {key: value for key, value in (lifecycle.get("stop") or {}).items() if key not in ONE_STOP_ONLY},
        "stage_models": lifecycle.get("stage_models"),
        "lock_path": lifecycle.get("lock_path"),
        "release": params.get("release"),
        "launched_at": time.time(),
        "pid": pid,
        "wanted": "running",
        "wanted_by": "the launch",
        "wanted_at": time.time(),
        "paused": before.get("paused"),  # the last Proxmox stop's account stays until the next one
        # a relaunch without a job (the hook's, the supervisor's) keeps the gang's meeting places
        # under the job's own, and the supervisor's rounds: a job's launch begins them afresh
        "gang_base": lifecycle.get("gang_base") or (params.get("gang_health") or {}).get("dir"),
        "rounds_dir": lifecycle.get("rounds_dir") or _new_rounds(directory, params),
        "round": lifecycle.get("round") or 0,
        # the run as it was before this launch: a rollback after a rejected healthy launch goes back to it
        "before": {key: before[key] for key in RUN_KEYS if key in before} if before.get("launch") else None,
    }
    _write(directory, spec)
    write_atomic(os.path.join(directory, "hook"),
                 f"#!/bin/sh\n# written by dflash.lifecycle's launch: the CT's side of its Proxmox hookscript\n"
                 f"exec {sys.executable} {os.path.join(directory, 'agent.zip')} \"$@\"\n", 0o700)


def relaunch_options(params, **changes):
    """The options that launch the release current points to again, resuming from the newest
    checkpoint (a run launched fresh resumes too: a stop kept one): nothing stopped, staged,
    activated or rolled back, unless changes say otherwise."""
    return {**params, "stop_first": None, "stage_models": None, "activate": None, "rollback_on_failure": False,
            "gang_stop": None, "resume_auto": not params["resumes"], **changes}


def relaunch_params(spec, health_dir=None):
    """The launch options that bring the run of spec back as it was, with no job (the Proxmox hook's,
    the supervisor's) or after a job's failed launch (its rollback): the last healthy launch's own,
    the model staged again, resuming from the newest checkpoint; a gang's health words in
    health_dir, the relaunch's own place. The caller sets lifecycle["dir"]."""
    params = relaunch_options(
        spec["launch"], stage_models=spec.get("stage_models"), rollback_launch=None, progress_file=None, refuse_busy=True,
        lifecycle={"dir": None, "stop": spec["stop"], "stage_models": spec.get("stage_models"),
                   "lock_path": spec.get("lock_path"),
                   # the run's next generation: the supervisor's rounds go on in a place of its own
                   "gang_base": spec.get("gang_base"), "rounds_dir": spec.get("rounds_dir"),
                   "round": (spec.get("round") or 0) + 1})
    if health_dir and params.get("gang_health"):
        params["gang_health"] = dict(params["gang_health"], dir=health_dir)
    return params


def settings_words(spec, params=None):
    """Which settings a relaunch of spec goes back to: its launch's moment and release, and the
    options of params (a failed job's) that differ from them, named, never shown (secrets)."""
    words = (f"the settings of its healthy launch at {change_record.stamp(spec.get('launched_at') or 0)} "
             f"(release {spec.get('release') or '(current)'})")
    if params is not None:
        own = spec["launch"]
        # the job's own: its lock, what it activates, what it decides at the moment of the launch
        differ = sorted(key for key in set(own) | set(params)
                        if key not in ONE_LAUNCH_ONLY + ("release", "resume_auto", "refuse_busy")
                        and not key.startswith("lock_") and own.get(key) != params.get(key))
        words += f"; this job's differed in {', '.join(differ)}" if differ else "; this job's were the same"
    return words


def stand_down_path(directory):
    return os.path.join(directory, "stand-down.json")


def stand_down(directory, by):
    """Before the first signal of a stop someone asked for: the run's supervisor stands down (the
    trainer's exit is that stop's, not a crash); nothing in a CT no launch kept a spec in.
    Raises OSError only."""
    if not os.path.isdir(directory):
        return
    write_atomic(stand_down_path(directory), json.dumps({"at": time.time(), "by": by, "pid": os.getpid()}))


def stand_down_cleared(directory):
    """After a stop that left the trainer running: the supervisor watches it again."""
    try:
        os.unlink(stand_down_path(directory))
    except FileNotFoundError:
        pass


def stood_down(directory, since):
    """The stop asked for since epoch since (the trainer's start), or None."""
    marker = read_mapping(stand_down_path(directory))
    return marker if marker is not None and (marker.get("at") or 0) >= since else None


def mark(directory, wanted, by, **fields):
    """Record what is wanted of the run now (running, stopped) and why; nothing when the CT has no
    spec. A wish someone states supersedes a job's failure (left_down). Raises OSError only."""
    spec = read(directory)
    if spec is None:
        return None
    spec.pop("left_down", None)
    spec.update(fields, wanted=wanted, wanted_by=by, wanted_at=time.time())
    _write(directory, spec)
    return spec


def left_down(directory, by, why):
    """A launch that failed and left no trainer running: the run stays as wanted as its spec says
    for the Proxmox hook (a CT start does not relaunch what just failed), but no one wanted it down -
    its metrics count it as wanted running, so that the run-down alert fires. Nothing when the CT
    has no spec. Raises OSError only."""
    spec = read(directory)
    if spec is None:
        return None
    spec["left_down"] = {"by": by, "at": time.time(), "why": why}
    _write(directory, spec)
    return spec


def summary(directory):
    """What the CT's Proxmox hook would do with the run, for `make status`: {wanted, wanted_by,
    wanted_at, release, paused, words}, or None when the CT keeps no spec."""
    spec = read(directory)
    if spec is None:
        return None
    since = change_record.stamp(spec.get("wanted_at") or 0)
    if spec.get("wanted") == "running":
        words = f"wanted running (since {spec.get('wanted_by')} at {since}): a CT start brings release " \
                f"{spec.get('release') or '(current)'} back"
    else:
        words = f"wanted stopped ({spec.get('wanted_by')} at {since}): a CT start leaves it down"
    paused = spec.get("paused")
    if paused:
        words += (f"; the last Proxmox stop ({change_record.stamp(paused['at'])}) "
                  f"{'FAILED its stop' if paused.get('failed') else 'stopped it by ' + str(paused.get('stopped_by'))}, "
                  f"checkpoint {paused.get('checkpoint')}, {paused.get('steps_lost')} steps lost")
    return dict({key: spec.get(key) for key in ("wanted", "wanted_by", "wanted_at", "release", "paused")}, words=words)
