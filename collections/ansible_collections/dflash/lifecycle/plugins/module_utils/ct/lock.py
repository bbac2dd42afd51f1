# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-CT redeploy lock: a lease in a root-only directory (Python 3.8 compatible).

The holder (user or AWX job) is recorded with the time it took the lock and when its
lease ends; each phase of a redeploy renews the lease (module_utils/leased.py). A lock
whose lease has ended belongs to a redeploy that is gone (killed, lost its connection) and
is taken over. A live lease is taken over only when the caller names its holder (takeover):
an operator who knows that run is gone need not wait for the lease to end, and a run that
took the lock since is not overrun by mistake.
Every change happens under flock on a guard file and lands by atomic rename of a file
opened with O_NOFOLLOW|O_EXCL, so no symlink planted in the directory is followed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import read_json, secure_dir, write_atomic


class LockHeld(Exception):
    def __init__(self, msg, holder):
        super().__init__(msg)
        self.holder = holder


def _read(path):
    try:
        return read_json(path)
    except ValueError:
        return {"holder": "unreadable lock file", "expires": 0}


def _guarded(path, action):
    secure_dir(os.path.dirname(path))
    fd = os.open(f"{path}.guard", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return action()
    finally:
        os.close(fd)


def describe(lock):
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lock.get("since", 0)))
    phase = f", last phase: {lock['phase']}" if lock.get("phase") else ""
    return f"{lock.get('holder')} since {since}{phase}"


def read(path):
    """The lock in place, or None."""
    try:
        return _read(path)
    except OSError:
        return None


def acquire(path, holder, ttl, now=None, takeover=None, phase=None):
    """Take or renew the lock for holder, recording the phase its holder is in; a live lease of
    another holder only when takeover names it. Returns (changed, lock, taken_over_from)."""
    now = time.time() if now is None else now

    def action():
        current = _read(path)
        taken_over = None
        if current is not None and current.get("holder") != holder:
            if current.get("expires", 0) > now and current.get("holder") != takeover:
                raise LockHeld(f"CT is being redeployed by {describe(current)} "
                               f"(lease until {time.strftime('%H:%M:%S UTC', time.gmtime(current['expires']))}); "
                               f"if that run is gone, take the lock over with lock_takeover naming it "
                               f"(the playbooks: -e "
                               f"{shlex.quote(json.dumps({'redeploy_lock_takeover': current.get('holder')}))}).",
                               current)
            taken_over = current
        since = current["since"] if current is not None and taken_over is None else now
        lock = {"holder": holder, "since": since, "expires": now + ttl, "phase": phase}
        write_atomic(path, json.dumps(lock), 0o600)
        return current is None or taken_over is not None, lock, taken_over

    return _guarded(path, action)


def take(path, holder, ttl, takeover=None, phase=None):
    """acquire() as a result: the lock in place, whom it was taken over from, changed, msg."""
    now = time.time()
    changed, held, taken_over = acquire(path, holder, ttl, now, takeover, phase)
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

    return _guarded(path, action)
