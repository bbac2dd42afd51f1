# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run work in a detached process inside the CT and wait for it (Python 3.8 compatible).

A staged stop must run to its end even when the controller's connection (ssh -> pct exec ->
lxc-attach) drops half way. The work runs in a grandchild in its own session with stdio on
/dev/null, so the end of the attached session does not reach it, and it leaves its result in
a root-only directory. The caller waits on a pipe the worker holds open: EOF comes the moment
the worker exits, with no polling interval added (Ansible's async would poll from the
controller, a round trip per poll and at least a second of added latency). A later call that
finds a worker still running waits for that one and returns its result instead of starting
a second stop.

The worker is what owns a job's work in the CT once it began (the redeploy's stop, model staging,
launch, health wait and rollback; a stop of its own), so nothing it does depends on the
controller that asked for it:
- a keeper process beside it renews the job's lock (lease) every third of its lease while it
  works, and stops with it: a long wait for a checkpoint keeps the CT, a dead worker frees it
  within one lease (module_utils/ct/lock.py);
- when its caller (the module process attached to the controller's connection) is gone by the
  time the work ends, on_orphaned(result) runs in the worker: nobody will read the result, so the
  worker itself records that and gives back what the caller would have;
- when its caller is to give the job's lock back with the result (unlock: the job's last step in
  the CT), the worker gives it back itself once its caller has ended (CALLER_EXIT_WAIT_S at most):
  a caller that died first - its controller gone, its answer's pipe broken - would leave the CT
  locked for the rest of the lease;
- once its result is delivered and its keeper ended, after(result) runs in it: a launch's worker
  becomes the run's supervisor there (module_utils/agent/supervise.py), the parent of the trainer it
  started.
"""

from __future__ import annotations

import json
import os
import signal

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import lock, proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import target_set, trainer_finding
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.stop_options import InvalidParameter
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct.rundir import read_json, secure_dir, write_atomic

ADOPT_WAIT_SLICE_SECONDS = 3600  # the wait has no bound; the stop's own ladder bounds it
CALLER_EXIT_WAIT_S = 5.0  # a caller that read the result exits within milliseconds


def _worker_file(state_dir, name):
    return os.path.join(state_dir, f"{name}.worker")


def _result_file(state_dir, name):
    return os.path.join(state_dir, f"{name}.result.json")


def running_worker(state_dir, name):
    """The worker of this name (a Process) while it still runs, else None."""
    try:
        entry = trainer_finding.read_pidfile(_worker_file(state_dir, name))
    except InvalidParameter:
        return None
    if entry is None or entry.starttime is None:
        return None
    proc = proctable.read_process(entry.pid)
    return proc if proc is not None and proc.identity == (entry.pid, entry.starttime) and not proc.gone else None


def _wait_gone(proc, seconds=None):
    """Until the process is gone (at most seconds; None: no bound), asleep in poll() on its pidfd
    where the kernel has them."""
    watcher = target_set.Targets()
    watcher.add(proc, "a process the worker waits for")
    try:
        if seconds is not None:
            watcher.wait_gone([proc.identity], seconds)
        else:
            while watcher.wait_gone([proc.identity], ADOPT_WAIT_SLICE_SECONDS):
                pass
    finally:
        watcher.close()


def _read_result(state_dir, name, worker_pid):
    try:
        record = read_json(_result_file(state_dir, name)) or {}
    except (OSError, ValueError):
        record = {}
    if record.get("worker") != worker_pid:
        return {"failed": True, "msg": f"the detached {name} (PID {worker_pid}) ended without "
                                       f"leaving a result in {state_dir}"}
    return record["result"]


def start_keeper(lease, me, pipe_w=None):
    """Fork the process that keeps lease (path, holder, ttl) alive while this worker (me) runs;
    returns its PID (end_keeper ends it), None without one. A process, not a thread: the worker
    forks and execs the trainer (preexec_fn), which a thread would make unsafe."""
    if not hasattr(os, "pidfd_open"):
        return None  # no keeper: each call of the job renews the lease, as before workers had one
    worker_pidfd = os.pidfd_open(me.pid)
    keeper = os.fork()
    if keeper == 0:
        status = 0
        try:
            if pipe_w is not None:
                os.close(pipe_w)  # the caller's EOF must come when the worker ends, not its keeper
            lock.keep_alive(lease, worker_pidfd, me.identity)
        except BaseException:  # noqa: BLE001  (a forked child must never return into the module)
            status = 1
        finally:
            os._exit(status)
    os.close(worker_pidfd)
    return keeper


def end_keeper(keeper):
    """End the keeper (its PID, ours) of a worker that goes on with other work: it renews the lease
    for as long as the worker's PID lives, and an exec keeps the PID."""
    if keeper is None:
        return
    try:
        os.kill(keeper, signal.SIGTERM)
        os.waitpid(keeper, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _give_back_after(caller, lease):
    """The job's lock given back once the caller (its identity) has ended, or after
    CALLER_EXIT_WAIT_S: nothing when the caller gave it back itself (lock.release: the holder's only)."""
    proc = proctable.read_process(caller[0])
    if proc is not None and proc.identity == caller:
        _wait_gone(proc, CALLER_EXIT_WAIT_S)
    try:
        lock.release(lease[0], lease[1])
    except (OSError, ValueError):
        pass  # the lease ends on its own


def _work_in_worker(work, state_dir, name, pipe_w, lease, caller, on_orphaned, after, unlock):
    """In the worker: never returns."""
    status = 0
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        me = proctable.read_process(os.getpid())
        write_atomic(_worker_file(state_dir, name), f"{me.pid} {me.starttime}\n")
        keeper = start_keeper(lease, me, pipe_w) if lease else None
        try:
            os.write(pipe_w, f"{me.pid}\n".encode())
        except OSError:
            pass  # the caller is gone already; the work goes on
        try:
            result = work()
        except Exception as err:  # noqa: BLE001  (any failure must reach the result file)
            result = {"failed": True, "msg": f"the detached {name} failed: {err!r}"}
        write_atomic(_result_file(state_dir, name), json.dumps({"worker": me.pid, "result": result}))
        os.unlink(_worker_file(state_dir, name))
        if on_orphaned is not None and not proctable.alive(caller):
            on_orphaned(result)
        give_back = unlock and lease and not result.get("failed")
        if after is not None or give_back:
            os.close(pipe_w)  # the caller reads the result now
            end_keeper(keeper)
            if give_back:
                _give_back_after(caller, lease)
            if after is not None:
                after(result)
    except BaseException:  # noqa: BLE001  (a forked child must never return into the module)
        status = 1
    finally:
        os._exit(status)


def run(work, state_dir, name, lease=None, on_orphaned=None, after=None, unlock=False):
    """work() -> result dict, run detached. Returns (result, adopted): adopted is True when a
    worker started by an earlier call was still running and this call waited for it. lease:
    the job's lock (path, holder, ttl), kept alive while the worker runs; on_orphaned(result):
    run in the worker when its caller is gone once the work ended; after(result): run in the
    worker once its caller has the result (it may exec); unlock: the caller gives the lease back
    with a result that did not fail, and the worker does once the caller ended (the module docstring)."""
    secure_dir(state_dir)
    caller = proctable.read_process(os.getpid()).identity
    earlier = running_worker(state_dir, name)
    if earlier is not None:
        _wait_gone(earlier)  # its own keeper and orphan rule cover its work
        return _read_result(state_dir, name, earlier.pid), True
    pipe_r, pipe_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(pipe_r)
            os.setsid()
            if os.fork() == 0:
                _work_in_worker(work, state_dir, name, pipe_w, lease, caller, on_orphaned, after, unlock)
        finally:
            os._exit(0)
    os.close(pipe_w)
    os.waitpid(child, 0)
    with os.fdopen(pipe_r, "rb") as pipe:
        received = pipe.read()  # returns at EOF: the worker has exited
    if not received.strip():
        return {"failed": True, "msg": f"the detached {name} did not start"}, False
    return _read_result(state_dir, name, int(received.split()[0])), False
