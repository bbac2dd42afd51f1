# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-CT redeploy lock: a lease in a root-only directory (Python 3.8 compatible).

The holder (user or AWX job) is recorded with the time it took the lock, when its lease ends
and when it was last renewed. The lease is short (a minute by default) and kept alive by
whoever works: each call of the job into the CT (module_utils/leased.py), and, while a detached
worker runs the job's work in the CT (a stop waiting for a checkpoint, a launch waiting for
health), a keeper process beside that worker (keep_alive), the worker recorded as ``worker``. A
holder that dies - a controller killed, a connection lost - stops renewing, and its lock is free
within one lease of its last work, as with Kubernetes' and etcd's leases. A lock whose lease has
ended is taken over. A live lease is taken over only when the caller names it by its
takeover code (takeover, for a holder known to be dead: 12 hex digits of a digest of the lock,
which the refusal gives - never the holder's text, which a CT wrote, to paste into a job), and
never while its worker still runs: that holder is alive and working, and the refusal names its
last renewal.
Every change happens under flock on a guard file and lands by atomic rename of a file
opened with O_NOFOLLOW|O_EXCL, so no symlink planted in the directory is followed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import guarded, read_json, write_atomic


class LockHeld(Exception):
    """A lock another holder keeps; held: its fields as a refusal gives them (held_fields)."""

    def __init__(self, msg, held):
        super().__init__(msg)
        self.held = held


UNREADABLE = {"holder": "unreadable lock file", "expires": 0}
TAKEOVER_CODE = re.compile(r"^[0-9a-f]{12}$")


def _read(path):
    """The lock at path (None: none), or UNREADABLE for a file that is not a lock this code writes:
    whoever planted it holds nothing."""
    try:
        current = read_json(path)
    except ValueError:
        return dict(UNREADABLE)
    if current is None or _is_lock(current):
        return current
    return dict(UNREADABLE)


def _is_lock(current):
    """Whether current has the fields and types of a lock this code writes."""
    if not isinstance(current, dict) or not isinstance(current.get("holder"), str):
        return False
    if not isinstance(current.get("phase") or "", str):
        return False
    if any(isinstance(current.get(key), bool) or not isinstance(current.get(key, 0), (int, float))
           for key in ("since", "expires", "renewed")):
        return False
    worker = current.get("worker")
    return worker is None or (isinstance(worker, list) and len(worker) == 2 and all(isinstance(i, int) for i in worker))


def takeover_code(lock):
    """The code that names lock for a takeover: 12 hex digits of a digest of its holder and since."""
    return hashlib.sha256(f"{lock.get('holder')}\0{lock.get('since')}".encode()).hexdigest()[:12]


def _clock(epoch):
    return time.strftime("%H:%M:%S UTC", time.gmtime(epoch))


def describe(lock):
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lock.get("since", 0)))
    phase = f", last phase: {lock['phase']}" if lock.get("phase") else ""
    return f"{lock.get('holder')} since {since}{phase}"


def live_worker(lock):
    """The PID of the detached worker that does lock's holder's work in the CT (its keeper renews
    the lease), while it still runs; else None."""
    worker = (lock or {}).get("worker")
    return worker[0] if worker and proctable.alive(tuple(worker)) else None


def read(path):
    """The lock in place, or None."""
    try:
        return _read(path)
    except OSError:
        return None


def held_fields(current):
    """A live lock of another holder as a refusal answers it: the controller writes the refusal's
    words, and the command to take it over, from these (plugin_utils/ct_action.py)."""
    return {"holder": str(current.get("holder")), "since": current.get("since"), "expires": current.get("expires"),
            "renewed": current.get("renewed", current.get("since")), "phase": current.get("phase"),
            "worker_pid": live_worker(current), "takeover_code": takeover_code(current)}


def _refusal(current, now):
    """The refusal in words, for the CT's own agents and logs; a job's controller writes its own."""
    renewed = current.get("renewed", current.get("since", 0))
    lease = (f"lease until {_clock(current['expires'])}, renewed last at {_clock(renewed)}, "
             f"{max(0, round(now - renewed))}s ago")
    worker = live_worker(current)
    if worker is not None:
        return (f"CT is being redeployed by {describe(current)} ({lease}); its worker in the CT (PID {worker}) "
                f"is alive and keeps the lease: it is not taken over. The lock is free "
                f"within {round(current['expires'] - current.get('renewed', now))}s of that worker's end.")
    return (f"CT is being redeployed by {describe(current)} ({lease}); it is free once the lease ends, "
            "unless renewed, or taken over with its takeover code.")


def acquire(path, holder, ttl, now=None, takeover=None, phase=None, takeover_holder=None):
    """Take or renew the lock for holder, recording the phase its holder is in; a live lease of
    another holder only when takeover is its takeover code (a person's), or takeover_holder its
    holder (the CT's own agents'), and no worker of that holder runs.
    Returns (changed, lock, taken_over_from)."""
    now = time.time() if now is None else now

    def action():
        current = _read(path)
        taken_over = None
        if current is not None and current.get("holder") != holder:
            live = current.get("expires", 0) > now
            named = (takeover == takeover_code(current)
                     or (takeover_holder is not None and current.get("holder") == takeover_holder))
            if live and (not named or live_worker(current) is not None):
                raise LockHeld(_refusal(current, now), held_fields(current))
            taken_over = current
        since = current["since"] if current is not None and taken_over is None else now
        lock = {"holder": holder, "since": since, "expires": now + ttl, "renewed": now, "phase": phase,
                "worker": None}
        write_atomic(path, json.dumps(lock), 0o600)
        return current is None or taken_over is not None, lock, taken_over

    return guarded(path, action)


def renew(path, holder, ttl, worker, phase=None):
    """Renew holder's lease for its worker (pid, starttime), keeping the phase unless phase is
    given. Returns False, changing nothing, when holder no longer holds the lock (taken over
    since): a worker never takes a lock back."""
    def action():
        current = _read(path)
        if current is None or current.get("holder") != holder:
            return False
        now = time.time()
        current.update(expires=now + ttl, renewed=now, worker=list(worker),
                       phase=current.get("phase") if phase is None else phase)
        write_atomic(path, json.dumps(current), 0o600)
        return True

    return guarded(path, action)


def keep_alive(lease, worker_pidfd, worker):
    """The keeper's loop: renew lease (path, holder, ttl) every third of its ttl while the worker
    (its pidfd, its (pid, starttime)) runs; once it is gone, stop renewing. The lease then ends one
    ttl after the worker's last renewal. Returns when the worker is gone or the lock was lost."""
    import select

    path, holder, ttl = lease
    poller = select.poll()
    poller.register(worker_pidfd, select.POLLIN)
    while True:
        try:
            if not renew(path, holder, ttl, worker):
                return
        except (OSError, ValueError):
            pass  # a full or read-only run directory: the next tick tries again
        if poller.poll(ttl / 3 * 1000):
            return


def take(path, holder, ttl, takeover=None, phase=None, takeover_holder=None):
    """acquire() as a result: the lock in place, whom it was taken over from, changed, msg."""
    now = time.time()
    changed, held, taken_over = acquire(path, holder, ttl, now, takeover, phase, takeover_holder)
    msg = f"locked for {holder}"
    if taken_over:
        how = "expired" if taken_over.get("expires", 0) <= now else "live (lock_takeover)"
        msg += f"; took over the {how} lock of {describe(taken_over)}"
    return dict(held, changed=changed, taken_over_from=taken_over, msg=msg)


def release(path, holder):
    """Drop the lock if holder has it. Returns changed."""
    def action():
        current = _read(path)
        if current is None or current.get("holder") != holder:
            return False
        os.unlink(path)
        return True

    return guarded(path, action)


def wait_for(path, holder, cap, ttl, takeover_holder=None):
    """Take the lock for holder (a lease of ttl seconds), waiting up to cap seconds for a job that
    holds it (its worker ends with the CT anyway); takeover_holder: a holder whose lock may be taken
    once its worker is gone. Returns None once held, else the words of the holder it went on
    without. The CT's own agents take it so (the Proxmox hook, the run's supervisor)."""
    deadline = time.monotonic() + cap
    while True:
        try:
            take(path, holder, ttl, takeover_holder=takeover_holder)
            return None
        except LockHeld as err:
            if time.monotonic() >= deadline:
                return str(err).split(". ", maxsplit=1)[0]
        except (OSError, ValueError) as err:
            return f"lock_path: {err}"
        time.sleep(1)
