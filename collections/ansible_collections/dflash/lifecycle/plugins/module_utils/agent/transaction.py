# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch as one call inside the CT: the stop first (stop_first), the model staged into
shared memory (stage_models), the launch (start.py) and, when it fails, the run of before brought
back (rollback.py, rollback_on_failure) (Python 3.8 compatible).

All of it, from the stop's first signal to the new run's health (or the old run's return), is one
transaction run by a detached worker in the CT (module_utils/stop/detached.py): a controller that
dies or is cancelled at any moment after the first signal leaves the worker to finish, its keeper
renews the job's lock while it works, and its outcome is kept on the CT's disk
(module_utils/ct/change_record.py) for `make status` and the next redeploy, which say when it
finished without its controller.

It knows nothing of the supervisor or the Proxmox hook: it returns what happened, and its callers
decide what follows (main.launch: the run's supervisor takes the trainer over).
"""

from __future__ import annotations

import os
import select

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import rollback, start
from ansible_collections.dflash.lifecycle.plugins.module_utils.agent.launch_options import LaunchFailed
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoints
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record, history, run_spec


def run(params, check_mode, warn, lease=None, unlock=False, after=None):
    """The launch of params (ARGUMENT_SPEC's, validated); returns the task's result, or raises
    LaunchFailed. Outside check mode it runs as one transaction in a detached worker (the module
    docstring); lease: the job's lock (path, holder, ttl), kept alive by the worker; unlock: the
    call gives it back with a healthy launch, and so does the worker once the call ended (a call
    killed with its controller gives nothing back); after(result): what the worker does once the
    result is delivered (the caller's: the run's supervisor takes over)."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable, rundir
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import detached

    params, settings = rollback.run_before(params)
    if check_mode:  # nothing is stopped, staged or started: what would be, from here
        return dict(start.start(params, True, {}), **settings)
    # the worker is no descendant of ours: our ancestors stay out of its stop's reach
    exclude = proctable.ancestors(proctable.snapshot(), os.getpid())

    def without_controller(result):
        change_record.without_controller(params["change_record"], lease)

    try:
        result, _adopted = detached.run(lambda: _transaction(params, exclude, lease), _state_dir(params), "launch",
                                        lease=lease, on_orphaned=without_controller, after=after, unlock=unlock)
    except (rundir.UnsafePath, OSError) as err:
        raise LaunchFailed(f"run_dir: {err}; nothing was stopped or started") from None
    if not _controller_attached():
        without_controller(result)
    for note in (result.get("stop") or {}).get("notes", []) + ([result["lifecycle_error"]] if result.get("lifecycle_error") else []):
        warn(note)
    if result.pop("failed", False):
        # what runs now, read from the CT: a worker that died (killed in its staging) left no result
        # that says whether it had stopped the run
        from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding
        result["trainer_running"] = trainer_finding.running(params["pidfile"], params["pattern"]) is not None
        raise LaunchFailed(result.pop("msg"), **dict(result, **settings))
    return dict(result, **settings)


def run_here(params, lease):
    """The launch's transaction in this process, already detached (the supervisor's relaunch): the
    trainer it starts is this process's child. Returns the result (failed: True inside)."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable

    return _transaction(params, proctable.ancestors(proctable.snapshot(), os.getpid()), lease)


def _state_dir(params):
    return params["run_dir"] or os.path.dirname(params["pidfile"])


def _controller_attached():
    """Whether this module's answer can still reach the controller: its stdout (the pipe of the
    connection: ssh, pct exec, lxc-attach) has a reader. A controller killed or cancelled while the
    worker ran closes it."""
    poller = select.poll()
    poller.register(1, 0)  # POLLERR and POLLHUP are always reported
    return not any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))


def _transaction(params, exclude, lease):
    """In the worker: the stop, the staging, the launch and, when the launch fails, the rollback;
    each phase recorded in the lock and the CT's record. Returns the result (failed: True inside)."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import lock, proctable

    record = params["change_record"]
    me = proctable.read_process(os.getpid()).identity

    def phase(name):
        try:
            if lease:
                lock.renew(lease[0], lease[1], lease[2], me, phase=name)
            change_record.update(record, phase=name)
        except (OSError, ValueError):
            pass  # bookkeeping never fails the work

    try:
        change_record.begin(record, lease[1] if lease else None,
                            "redeploy" if params["stop_first"] else "launch", me[0])
    except OSError:
        pass
    try:
        result = _steps(params, exclude, phase)
    except LaunchFailed as err:
        result = dict(err.details, failed=True, msg=err.msg)
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding

    running = trainer_finding.running(params["pidfile"], params["pattern"])  # read from the CT, never inferred
    try:
        change_record.end(record, result.get("failed"), outcome_words(
            result, f"trainer PID {running.pid} runs" if running is not None else "NO TRAINER IS RUNNING"))
    except OSError:
        pass
    directory = (params.get("lifecycle") or {}).get("dir")
    if result.get("failed") and running is None and directory:
        try:  # a failure no one wanted: the run's metrics say it is down though wanted
            run_spec.left_down(directory, lease[1] if lease else "a relaunch", (result.get("msg") or "").splitlines()[0][:400])
        except OSError:
            pass
    return result


def _steps(params, exclude, phase):
    from ansible_collections.dflash.lifecycle.plugins.module_utils import gang_agreement

    done = {}
    # the run as it was before this job: what a rollback brings back (its launch rewrites the spec)
    directory = (params.get("lifecycle") or {}).get("dir")
    spec = run_spec.read(directory) if directory else None
    gang = params["gang_stop"]
    if params["stop_first"]:
        phase("stop")
        # every later result carries the stop's: what the report and a rescue read
        try:
            done["stop"] = _stop_first(params, exclude)
        except LaunchFailed as err:
            if gang:  # the other members stop waiting for this one at once
                gang_agreement.tell_stopped(gang, err.details.get("stop") or {"failed": True, "msg": err.msg})
            raise
    if gang:
        phase("gang agreement")
        agreed = gang_agreement.agree(gang, done.get("stop"), lambda: checkpoints.newest_complete(params))
        done["gang_stop"] = {key: agreed[key] for key in ("checkpoint", "problems", "after")}
        if agreed["problems"]:
            phase("relaunch")
            raise LaunchFailed(f"gang {gang['name']} after its stop: {'; '.join(agreed['problems'])}",
                               rollback=rollback.relaunch_after_stop(params, agreed["relaunch"], spec), **done)
    before = rollback.links(params)
    try:
        if params["stage_models"]:
            phase("stage model")
            done["staged"] = start.stage(params, done)
        phase("launch")
        result = start.start(params, False, done)
        if params["gang_health"]:
            _gang_launched(params, result)
        if directory:
            history.record_launch(directory, done.get("stop"), result)
        return result
    except LaunchFailed as err:
        if not params["rollback_on_failure"]:
            raise
        phase("rollback")
        err.details["rollback"] = rollback.rollback(params, err, before, exclude, spec)
        raise


def _gang_launched(params, result):
    """A CT of a gang whose own launch was healthy waits until every other CT's launch said how it
    went: one that failed fails this one too, its healthy run included, so that the gang rolls back
    whole (raises LaunchFailed); one that says nothing within the health wait leaves it as it is."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import gang_health

    failed = gang_health.gang_outcome(params["gang_health"], params["health_timeout"] + params["throughput_timeout"])
    if failed:
        facts = {key: value for key, value in result.items() if key not in ("msg", "changed")}
        raise LaunchFailed(_own_run_words(params, result) or (
            f"{failed[0]} of the gang failed its launch ({failed[1]}): this CT's run, healthy, goes back with the "
            "gang"), **dict(facts, running=True, peer=failed[0]))


def _own_run_words(params, result):
    """This CT's run, healthy a moment ago, when it has ended or printed a traceback since (a rank
    that raised after the start: the other CT's collectives then fail too), as the barrier after a
    launch says it; None while it runs clean."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable, progress

    proc = proctable.read_process(result["pid"])
    ended = proc is None or proc.gone
    lines = progress.read_lines(params["log_file"])
    found = progress.traceback_in(lines)
    if not ended and not found:
        return None
    last = (found or lines[-progress.TAIL_LINES:] or [""])[-1].strip()
    how = "ended" if ended else "printed a traceback (its agent tearing down)"
    return f"its run (PID {result['pid']}) {how} after its launch was healthy" + (f": {last}" if last else "")


def outcome_words(result, running_words):
    """The transaction's result in one line, for the CT's record: what it did, then what runs."""
    words = result.get("msg") or "no message"
    undone = result.get("rollback")
    if undone is not None:
        words += f"; rollback failed: {undone.get('msg')}" if undone.get("failed") else f"; {undone.get('msg')}"
    return f"{words}; {running_words}" if result.get("failed") else words


def _stop_first(params, exclude):
    """The stop before the launch (stop_first), in this worker; raises LaunchFailed when it did
    not end as asked. Returns its result."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop, stop_options

    try:
        options = stop_options.checked(params["stop_first"], "stop_first")
    except stop_options.InvalidParameter as err:
        raise LaunchFailed(f"{err}; nothing was stopped or started") from None
    options.detach = False  # this worker is detached already
    options.exclude_pids.update(exclude)
    result = staged_stop.run_in_module(options, cause="redeploy")
    if result.get("failed"):
        raise LaunchFailed(f"the stop failed, nothing was started: {result.get('msg')}", stop=result)
    return result
