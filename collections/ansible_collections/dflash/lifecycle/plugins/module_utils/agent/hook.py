# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CT's side of the project's Proxmox hookscript (Python 3.8 compatible).

pve-container runs a CT's hookscript on the node as ``<script> <vmid> <phase>``
(PVE::GuestHelpers::exec_hookscript): ``pre-stop`` in PVE::LXC::vm_stop before ``lxc-stop``, for
a stop, a shutdown, a reboot and a restart migration alike, with no timeout and its errors only
warned; ``post-start`` in PVE::LXC::vm_start once the CT runs. The node's script
(module_utils/node/installed_hookscript.py) runs this, inside the CT, through
``pct exec <vmid> -- /var/lib/dflash/lifecycle/hook <phase>``, with what the run's last launch kept on
the CT's disk (module_utils/ct/run_spec.py). The node trusts none of it: it shows what this prints
in the task's log, capped and cleaned, and ends it at the bound of its own policy for the CT:

- ``pre-stop``: the staged stop a ``make stop`` runs (the stop request where the trainer honours
  it, else the signal ladder, every checkpoint rule included), under the CT's redeploy lock, before
  the CT's init kills the trainer without its checkpoint. The run stays wanted: the CT's next start
  brings it back. A run stopped on purpose, or none running, costs nothing.
- ``post-start``: returns at once (Proxmox's start task waits for the hook) and leaves a detached
  ``resume`` to stage the model into the wiped /dev/shm and relaunch the run's release with its own
  settings, resuming from its checkpoint - the launch's own transaction
  (module_utils/agent/transaction.py). A gang's member relaunches once every member's CT is up again,
  meeting the others in the checkpoint directory they share; one that does not come back within
  the bound leaves the gang down, said.

Each phase prints one line for the node's task log and keeps its outcome in the CT's change record
(``make status``: last_change).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record, history, lock, run_spec
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import read_json, write_atomic


PRE_STOP_HOLDER = "Proxmox pre-stop hook"


POST_START_HOLDER = "Proxmox post-start hook"


LEASE_SECONDS = 60


GANG_POLL_SECONDS = 1.0


# a pre-stop's own time beyond its waits: the agent's start, the checkpoint's verification, its record
PRE_STOP_SLACK_S = 30.0


def say(phase, text):
    sys.stdout.write(f"dflash {phase}: {text}\n")
    sys.stdout.flush()


def _record(spec):
    return spec["launch"].get("change_record") or change_record.DEFAULT_PATH


def _gang(spec):
    """The gang's meeting place (dir, me, members) of a gang member's spec, or None: under the
    job's own, whatever rounds the supervisor's restarts went through since."""
    health = spec["launch"].get("gang_health")
    return dict(health, dir=os.path.join(spec.get("gang_base") or health["dir"], "ct-restarts")) if health else None


def _stays_stopped(spec):
    return (f"the run was stopped on purpose ({spec.get('wanted_by')} at {change_record.stamp(spec.get('wanted_at') or 0)}): "
            "it stays stopped")


def pre_stop_bound(stop, margin):
    """The longest this CT's pre-stop may take with the run's stop options (a mapping of staged_stop's):
    a gang's margin to its moment, the wait for a job that holds the CT's lock (up to graceful_wait_cap),
    the staged stop's worst case, and the agent's own time. The node's hookscript ends the hook there
    (the install writes it into the CT's policy on every node)."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import stop_options

    lock_wait = float(stop_options.given(stop, "graceful_wait_cap"))
    return float(margin) + lock_wait + stop_options.worst_case_s(stop) + PRE_STOP_SLACK_S


def _wanted_running(directory, phase):
    """(the run's spec, its stop's options) when the CT keeps a run wanted running with valid stop
    options, else (None, the exit status), said."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import stop_options

    spec = run_spec.read(directory)
    if spec is None:
        say(phase, f"no run launched by dflash.lifecycle in this CT ({run_spec.spec_path(directory)}): nothing to stop")
        return None, 0
    if spec.get("wanted") != "running":
        say(phase, _stays_stopped(spec))
        return None, 0
    try:
        return spec, stop_options.checked(spec["stop"], "the run's stop options")
    except stop_options.InvalidParameter as err:
        say(phase, f"NOTHING WAS SAVED: {err}; the CT's stop ends the trainer without its checkpoint")
        return None, 1


def pre_stop(directory, moment=None, phase="pre-stop"):
    """The run's staged stop before Proxmox stops the CT; moment: when a gang's members send their
    first signal (the node's hookscript stops them all at once). Returns the exit status (0:
    Proxmox only warns on a hookscript's error, and the CT stops either way)."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop, trainer_finding

    spec, options = _wanted_running(directory, phase)
    if spec is None:
        return options
    # the run's supervisor lets it end (module_utils/agent/supervise.py); told before the lock too, so
    # that a relaunch of its own that holds or waits for the lock gives up
    with contextlib.suppress(OSError):
        run_spec.stand_down(directory, PRE_STOP_HOLDER)
    ct_lock = run_spec.lock_path(spec)
    went_on = lock.wait_for(ct_lock, PRE_STOP_HOLDER, options.graceful_wait_cap, LEASE_SECONDS)
    # the lock's holder (post-start's relaunch, the supervisor's, a job) may have launched or stopped
    # the run meanwhile: this stop is of what it left, and a trainer launched since the word above
    # takes only a newer one for its stop (run_spec.stood_down)
    spec, options = _wanted_running(directory, phase)
    if spec is None:
        return options
    launch = spec["launch"]
    if trainer_finding.running(launch["pidfile"], launch.get("pattern")) is None:
        say(phase, "no trainer runs (it ended on its own since its launch); the CT's next start relaunches it")
        return 0
    options.lifecycle_dir = None  # this stop is Proxmox's: the run stays wanted
    options.signal_at = moment
    try:
        run_spec.stand_down(directory, PRE_STOP_HOLDER)
    except OSError as err:
        say(phase, f"the run's supervisor was not told ({err}): it may restart the run before the CT stops")
    record = _record(spec)
    try:
        change_record.begin(record, PRE_STOP_HOLDER, "stop before Proxmox stops the CT", os.getpid())
    except OSError:
        pass
    lease = None if went_on else (ct_lock, PRE_STOP_HOLDER, LEASE_SECONDS)
    began = time.time()
    result = staged_stop.run_in_module(options, lease=lease, record_dir=directory, cause="proxmox")
    checkpoint = result.get("checkpoint") or {}
    kept = checkpoint.get("new") or checkpoint.get("newest")
    loss = result.get("loss") or {}
    words = result.get("msg") or "the stop said nothing"
    if went_on:
        words += f" (it did not wait for {went_on})"
    failed = bool(result.get("failed"))
    try:
        change_record.end(record, failed, words)
        # the stop's own account (its timeline: each signal, the trainer's exit), for bench/pve_hooks.py
        write_atomic(os.path.join(directory, "pre-stop.json"), json.dumps(dict(
            {key: result.get(key) for key in ("stopped_by", "timeline", "checkpoint", "loss", "cpu_s", "msg")},
            began=began, ended=time.time(), failed=failed)))
        stopped_by = result.get("stopped_by")
        run_spec.mark(directory, "running", PRE_STOP_HOLDER, paused={
            "at": time.time(), "failed": failed, "checkpoint": kept,
            "steps_lost": loss.get("steps_lost"),
            "stopped_by": stopped_by.get("signal") or "the stop request" if isinstance(stopped_by, dict) else stopped_by})
        gang = _gang(spec)
        if gang:
            _tell(gang, "paused", {"checkpoint": kept})
        # the lock stays with the hook: no job starts a run in the moment before lxc-stop, and the
        # CT's stop wipes /run, lock and all (a CT that does not stop gets it back within the lease)
    except OSError as err:
        words += f"; its record could not be written: {err}"
    say(phase, ("THE STOP FAILED: " if failed else "") + words)
    return 1 if failed else 0


def _tell(gang, state, facts):
    """This member's word in the gang's meeting place: paused (its CT stopping), up (its CT started)."""
    folder = os.path.join(gang["dir"], state)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    write_atomic(os.path.join(folder, f"{gang['me']}.json"), json.dumps(dict(facts, at=time.time())), mode=0o644)


def _heard(gang, state):
    """{member: its word} of state, for the members that said it."""
    words = {}
    for member in gang["members"]:
        try:
            word = read_json(os.path.join(gang["dir"], state, f"{member}.json"))
        except (OSError, ValueError):
            continue
        if word is not None:
            words[member] = word
    return words


def gang_meets(gang, wait):
    """After this member's CT started: wait until every member's CT is up again since the gang's
    newest pause. Returns (round, None) when all are, else (None, words naming who is missing)."""
    _tell(gang, "up", {})
    deadline = time.monotonic() + wait
    while True:
        paused = _heard(gang, "paused")
        since = max([word.get("at", 0) for word in paused.values()] or [0])
        up = _heard(gang, "up")
        missing = [member for member in gang["members"] if up.get(member, {}).get("at", 0) <= since]
        if not missing:
            return f"{since:.0f}", None
        if time.monotonic() >= deadline:
            return None, (f"{', '.join(missing)} did not come back within {wait:.0f} s of this CT's start "
                          "(only its CT's start, or `make start`, relaunches it): THE GANG STAYS DOWN")
        time.sleep(GANG_POLL_SECONDS)


def resume(directory, phase="post-start"):
    """In the detached process post-start left: bring the run back, one relaunch a CT at a time. A
    gang's CT is asked by its own node and by every other member's: the second relaunch waits for
    the first (an flock, gone with its process), then finds the run running. Two at once would both
    pass the check for a running trainer, and both launch: two agents of one member in the gang's
    rendezvous. Returns the exit status."""
    guard = os.open(os.path.join(directory, "resume.lock"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        return _resume(directory, phase)
    finally:
        os.close(guard)


def _resume(directory, phase):
    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import supervise, transaction
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding

    spec = run_spec.read(directory)
    if spec is None or spec.get("wanted") != "running":
        say(phase, "nothing to relaunch" if spec is None else _stays_stopped(spec))
        return 0
    running = trainer_finding.running(spec["launch"]["pidfile"], spec["launch"].get("pattern"))
    if running is not None:  # a gang's other member asked too, or the run never stopped
        say(phase, f"the run already runs (PID {running.pid}): nothing to relaunch")
        return 0
    record = _record(spec)
    gang_round = None
    gang = _gang(spec)
    if gang:
        gang_round, missing = gang_meets(gang, float(spec["launch"].get("health_timeout") or 300))
        if missing:
            try:
                change_record.begin(record, POST_START_HOLDER, "relaunch after the CT started", os.getpid())
                change_record.end(record, True, missing)
            except OSError:
                pass
            say(phase, missing)
            return 1
    ct_lock = run_spec.lock_path(spec)
    # a gang's member whose CT did not stop still has the lock of the pre-stop its peer asked for
    went_on = lock.wait_for(ct_lock, POST_START_HOLDER, LEASE_SECONDS, LEASE_SECONDS, takeover_holder=PRE_STOP_HOLDER)
    if went_on:
        say(phase, f"not relaunched: {went_on} holds the CT")
        return 1
    params = run_spec.relaunch_params(spec, os.path.join(gang["dir"], gang_round) if gang else None)
    params["lifecycle"]["dir"] = directory
    lease = (ct_lock, POST_START_HOLDER, LEASE_SECONDS)
    try:
        result = transaction.run(params, False, lambda note: say(phase, note), lease, after=supervise.taking_over(params))
        resumed = (result.get("resume") or {}).get("path")
        say(phase, f"the run is back: {result.get('msg')}, " + (
            f"resuming from {resumed}" if resumed else "with no checkpoint to resume from"))
        return 0
    except transaction.LaunchFailed as err:
        say(phase, f"THE RELAUNCH FAILED: {err.msg}")
        return 1
    finally:
        try:
            lock.release(ct_lock, POST_START_HOLDER)
        except OSError:
            pass


def post_start(directory):
    """Leave the relaunch to a detached process and return at once: Proxmox's start task waits
    for its hookscript. Returns the exit status."""
    spec = run_spec.read(directory)
    if spec is None:
        say("post-start", "no run launched by dflash.lifecycle in this CT: nothing to relaunch")
        return 0
    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import metrics_process

    history.record_post_start(directory)
    metrics_process.ensure(directory, wait_s=0)  # the run's metrics, wanted or not (Proxmox's start waits for us)
    if spec.get("wanted") != "running":
        say("post-start", _stays_stopped(spec))
        return 0
    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import payload

    payload.run_detached(directory, "resume", "resume.log")
    log = os.path.join(directory, "resume.log")
    say("post-start", f"the relaunch of release {spec.get('release') or '(current)'} goes on detached in the CT "
                      f"(its log: {log}; its outcome: make status, last_change)")
    return 0
