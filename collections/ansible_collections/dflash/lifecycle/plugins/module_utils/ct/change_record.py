# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CT's own record of the last change a job made to its run (Python 3.8 compatible).

From the stop's first signal on, the CT's detached worker owns a redeploy (module_utils/
agent/transaction.py): whatever happens to the controller, the worker finishes it - the new run
healthy, or the release of before back from its checkpoint. The controller may then never hear
how it ended, so the worker keeps it here, on the CT's disk (``/var/lib/dflash``: it outlives
``/run``, which a CT restart wipes): who started the change and when, the phase it reached, how it
ended, and whether its controller was still there to read the result. ``make status`` and the
next redeploy's preflight read it and say, for a change that ended without its controller,
"the redeploy started at T by X finished without its controller: ...".
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import UnsafePath, guarded, read_json, write_atomic

DEFAULT_PATH = "/var/lib/dflash/last-change.json"


def stamp(epoch):
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def read(path):
    """The record, or None when there is none (or it cannot be read)."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def _changed(path, change):
    """change(record or None) -> the record to write, or None to leave it, under the record's
    guard: the CT's worker and a job's call that marks it (mark_unseen) both read, change and
    write it, and neither may lose the other's field. Returns whether it wrote. Raises OSError
    only (an unsafe directory included): the record never fails the work."""
    os.makedirs(os.path.dirname(os.path.dirname(path)), exist_ok=True)  # a bare CT may have no /var/lib

    def action():
        record = change(read(path))
        if record is not None:
            write_atomic(path, json.dumps(record))
        return record is not None

    try:
        return guarded(path, action)
    except UnsafePath as err:
        raise OSError(str(err)) from None


def begin(path, holder, what, worker):
    """A change begins: holder (the job's lock holder), what (a few words), worker (pid)."""
    record = {"holder": holder, "what": what, "started_at": time.time(), "phase": "start", "worker": worker,
              "finished_at": None, "failed": None, "outcome": None, "controller": "attached", "reported": False}
    _changed(path, lambda _old: record)
    return record


def update(path, **fields):
    """Record fields (phase=..., and the like) of the change under way."""
    _changed(path, lambda record: dict(record or {}, **fields))


def mark_unseen(path, holder):
    """The change holder's job made (holder None: whichever) will not be seen to end by its
    controller - it died, or its job was cancelled: the record says so (controller: gone), and
    ``make status`` and the next redeploy report it. Returns whether it marked the record (not
    when it is another job's, or marked already). Raises OSError."""
    def change(record):
        if record is None or record.get("controller") == "gone" or \
                (holder is not None and record.get("holder") not in (None, holder)):
            return None
        return dict(record, controller="gone")

    return _changed(path, change)


def end(path, failed, outcome):
    update(path, finished_at=time.time(), failed=bool(failed), outcome=" ".join(str(outcome).split()))


def unattended(record, worker_running=False):
    """Whether record is of a change its controller did not see end: the worker found its caller
    gone, or the worker itself died before it ended (nothing runs it, no outcome)."""
    if not record:
        return False
    if record.get("controller") == "gone":
        return True
    return record.get("finished_at") is None and not worker_running


def words(record, worker_running=False):
    """The record in one line."""
    started = f"the {record.get('what') or 'change'} started at {stamp(record.get('started_at') or 0)} " \
              f"by {record.get('holder') or 'an unnamed job'}"
    if record.get("finished_at") is None:
        if worker_running:
            return f"{started} is under way in the CT (phase: {record.get('phase')}, worker PID {record.get('worker')})"
        return (f"{started} ended without a result in phase {record.get('phase')}: its worker (PID "
                f"{record.get('worker')}) is gone; what runs now is what `make status` shows")
    how = "failed" if record.get("failed") else "finished"
    without = " without its controller" if record.get("controller") == "gone" else ""
    return f"{started} {how}{without} at {stamp(record['finished_at'])}: {record.get('outcome')}"


def last(path, worker_running):
    """The record at path with ``unattended`` and ``words``, or None; worker_running() says whether
    the worker of a change not ended still runs (asked only then)."""
    record = read(path) if path else None
    if record is None:
        return None
    working = record.get("finished_at") is None and worker_running()
    return dict(record, unattended=unattended(record, working), words=words(record, working))


def without_controller(path, lease):
    """Nobody will read the worker's result: the record says so (the next `make status` and
    redeploy report it), and the job's lock, lease (path, holder, ttl) or None, is given back at
    once, as the job would have. Never fails: the lease ends on its own within its ttl."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import lock

    try:
        mark_unseen(path, lease[1] if lease else None)
    except OSError:
        pass  # the outcome stays in the record as the worker wrote it
    if lease:
        try:
            lock.release(lease[0], lease[1])
        except OSError:
            pass
