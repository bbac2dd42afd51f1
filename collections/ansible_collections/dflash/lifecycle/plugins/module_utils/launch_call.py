# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch as one call inside the CT: the stop first (stop_first), the model staged into
shared memory (stage_models), the run directory, the refusals, the wait for free GPUs, the resume,
the activation, the start, the health wait and, when that launch fails, the release of before
relaunched from its checkpoint (rollback_on_failure).

All of it, from the stop's first signal to the new run's health (or the old run's return), is one
transaction run by a detached worker in the CT (module_utils/stop/detached.py): a controller that
dies or is cancelled at any moment after the first signal leaves the worker to finish, its keeper
renews the job's lock while it works, and its outcome is kept on the CT's disk
(module_utils/ct/change_record.py) for `make status` and the next redeploy, which say when it
finished without its controller.

Both modules that launch run it: trainer_process as its whole work, and trainer_preflight after its
checks (its ``launch`` option), so a CT that runs alone is preflighted, stopped and relaunched in
one round trip when nothing is to be pushed in between. ARGUMENT_SPEC is trainer_process's (its
DOCUMENTATION documents it), less the lock's options.
"""

from __future__ import annotations

import os
import re
import select

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.dflash.lifecycle.plugins.module_utils import supervisor
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_formats
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record, progress, run_spec

# the models staged between the stop and the launch, and before a relaunch after a CT restart
STAGE_MODELS = {"type": "dict", "options": {
    "models": {"type": "dict", "required": True},
    "reserve_gb": {"type": "float", "default": 32},
    "workers": {"type": "int", "default": 4},
    "progress_file": {"type": "path"},
}}

ARGUMENT_SPEC = {
    "command": {"type": "list", "elements": "str", "required": True},
    "cwd": {"type": "path", "default": "/"},
    "pidfile": {"type": "path", "required": True},
    "pattern": {"type": "str"},
    "run_dir": {"type": "path"},
    "wrapper_script": {"type": "str"},
    "secrets_env": {"type": "str", "no_log": True},
    "create_dirs": {"type": "list", "elements": "path", "default": []},
    "stop_first": {"type": "dict"},
    "refuse_busy": {"type": "bool", "default": True},
    "device_paths": {"type": "list", "elements": "str", "default": []},
    "gpus": {"type": "list", "elements": "int", "default": []},
    "nvidia_smi": {"type": "path", "default": "/usr/bin/nvidia-smi"},
    "gpu_free_threshold_mib": {"type": "int", "default": 1024},
    "gpu_free_timeout": {"type": "float", "default": 60},
    "log_file": {"type": "path", "required": True},
    "model_dirs": {"type": "list", "elements": "path", "default": []},
    "log_keep": {"type": "int", "default": 5},
    "checkpoint_dir": {"type": "path"},
    **checkpoint_formats.ARGUMENT_SPEC,
    "min_free_gb": {"type": "float", "default": 0},
    "resume_auto": {"type": "bool", "default": False},
    "resumes": {"type": "bool", "default": False},
    "incomplete_checkpoint": {"type": "str", "choices": ["move_aside", "fail"], "default": "move_aside"},
    "resume_args": {"type": "list", "elements": "str", "default": ["--resume"]},
    "health_seconds": {"type": "float", "default": 5},
    "gang": {"type": "bool", "default": False},
    "gang_health": {"type": "dict", "options": {
        "dir": {"type": "path", "required": True},
        "me": {"type": "str", "required": True},
        "members": {"type": "list", "elements": "str", "required": True},
    }},
    "step_regex": {"type": "str", "default": progress.STEP_REGEX, "aliases": ["health_regex"],
                   "deprecated_aliases": [{"name": "health_regex", "version": "0.3.0",
                                           "collection_name": "dflash.lifecycle"}]},
    "throughput_patterns": {"type": "list", "elements": "str", "default": list(progress.THROUGHPUT_PATTERNS)},
    "profile_line_regex": {"type": "str", "default": progress.PROFILE_LINE_REGEX},
    "profile_stage_regex": {"type": "str", "default": progress.PROFILE_STAGE_REGEX},
    "throughput_lines": {"type": "int", "default": 5},
    "throughput_warmup_lines": {"type": "int", "default": 1},
    "throughput_timeout": {"type": "float", "default": 300},
    "progress_file": {"type": "path"},
    "health_timeout": {"type": "float", "default": 300},
    "release_base": {"type": "path"},
    "stage_models": STAGE_MODELS,
    "rollback_on_failure": {"type": "bool", "default": False},
    "settings_from": {"type": "str", "choices": ["job", "last_launch", "launch_before_last"], "default": "job"},
    "rollback_launch": {"type": "dict", "options": {
        "wrapper_script": {"type": "str", "required": True},
        "gang_health_dir": {"type": "path"},
    }},
    "gang_stop": {"type": "dict", "options": {
        "name": {"type": "str", "required": True},
        "dir": {"type": "path", "required": True},
        "me": {"type": "str", "required": True},
        "members": {"type": "list", "elements": "str", "required": True},
        "wait": {"type": "float", "default": 960},
        "on_missing_checkpoint": {"type": "str", "default": "fail"},
    }},
    "change_record": {"type": "path", "default": change_record.DEFAULT_PATH},
    "supervise": supervisor.POLICY,
    "lifecycle": {"type": "dict", "options": {
        "dir": {"type": "path"},
        "gang_base": {"type": "path"},
        "rounds_dir": {"type": "path"},
        "round": {"type": "int"},
        "stop": {"type": "dict", "default": {}},
        "stage_models": STAGE_MODELS,
        "lock_path": {"type": "path"},
    }},
    "activate": {"type": "dict", "options": {
        "base": {"type": "path", "required": True},
        "release": {"type": "str", "required": True},
        "legacy_links": {"type": "list", "elements": "dict", "default": []},
    }},
}


class InvalidLaunch(ValueError):
    """Launch options given to another module that trainer_process would refuse."""


class LaunchFailed(Exception):
    """The launch ended without a healthy trainer; details are the task result's other keys
    (the stop's result among them once it ran: a rescue reads it)."""

    def __init__(self, msg, **details):
        super().__init__(msg)
        self.msg, self.details = msg, details


def checked(options, where):
    """(params, secret values) of launch options given to another module (the preflight's launch),
    validated as trainer_process validates its own; errors name the option as where.<name>."""
    if not isinstance(options, dict):
        raise InvalidLaunch(f"{where}: must be a mapping of dflash.lifecycle.trainer_process's options")
    validated = ArgumentSpecValidator(ARGUMENT_SPEC).validate(options)
    messages = validated.error_messages or supervisor.policy_problems(
        validated.validated_parameters.get("supervise") or {})
    if messages:
        raise InvalidLaunch("; ".join(f"{where}: {message}" for message in messages))
    # the secret values AnsibleModule itself takes from its own validation (basic.py reads the same)
    return validated.validated_parameters, validated._no_log_values


def deferred(check_mode, release, preflight, launch):
    """Why a launch asked of the preflight's call cannot run in it, or None: what redeploy.yml does
    between the checks and the launch - the push of a release not installed (trainer_code's push.yml),
    the staging of a model the launch does not stage itself (trainer_model's stage.yml). release: the
    preflight's release option; preflight: its result; launch: the launch's options."""
    if check_mode:
        return "check mode: the launch's own task reports what it would do"
    if release and not preflight["release_status"]["present"]:
        return f"release {release['release']} is to be pushed first"
    if preflight["model_stage_needed"] and not launch.get("stage_models"):
        return "a model is to be staged between the stop and the launch"
    return None


def run(params, check_mode, warn, lease=None, unlock=False):
    """The launch of params (ARGUMENT_SPEC's, validated); returns the task's result, or raises
    LaunchFailed. Outside check mode it runs as one transaction in a detached worker (the module
    docstring); lease: the job's lock (path, holder, ttl), kept alive by the worker; unlock: the
    call gives it back with a healthy launch, and so does the worker once the call ended (a call
    killed with its controller gives nothing back)."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable, rundir
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import detached

    params, settings = run_before(params)
    if check_mode:  # nothing is stopped, staged or started: what would be, from here
        return dict(_launch(params, True, {}), **settings)
    # the worker is no descendant of ours: our ancestors stay out of its stop's reach
    exclude = proctable.ancestors(proctable.snapshot(), os.getpid())

    def without_controller(result):
        change_record.without_controller(params["change_record"], lease)

    lifecycle = params.get("lifecycle") or {}
    # the worker that started the trainer stays its parent: the run's supervisor (module_utils/supervisor.py)
    after = (lambda result: supervisor.take_over(lifecycle["dir"], params["pidfile"])) \
        if lifecycle.get("dir") and params.get("supervise") else None
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


def run_before(params):
    """(the options to launch, {settings: words} or {}) for settings_from: the job's own, or those of a
    launch the CT keeps (run.json) - its last (a rollback after a launch that failed, which kept nothing)
    or the one before it (after a healthy launch the job rejected: the canary, a gang's failure
    elsewhere) - as a relaunch of that run with this job's lifecycle place and gang health place."""
    wanted = params.get("settings_from") or "job"
    if wanted == "job":
        return params, {}
    directory = (params.get("lifecycle") or {}).get("dir")
    spec = run_spec.read(directory) if directory else None
    if spec is not None and wanted == "launch_before_last":
        spec = spec.get("before")
    if not spec:
        return params, {"settings": "this job's settings (the CT keeps no earlier launch of the run)"}
    again = run_spec.relaunch_params(spec, (params.get("gang_health") or {}).get("dir"))
    again["lifecycle"]["dir"] = directory
    return again, {"settings": run_spec.settings_words(spec, params)}


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
    try:
        change_record.end(record, result.get("failed"), outcome_words(result, _running_words(params)))
    except OSError:
        pass
    return result


def _running_words(params):
    """What runs now, read from the CT (never inferred from the steps)."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding

    running = trainer_finding.running(params["pidfile"], params["pattern"])
    return f"trainer PID {running.pid} runs" if running is not None else "NO TRAINER IS RUNNING"


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
        agreed = gang_agreement.agree(gang, done.get("stop"), lambda: newest_complete(params))
        done["gang_stop"] = {key: agreed[key] for key in ("checkpoint", "problems", "after")}
        if agreed["problems"]:
            phase("relaunch")
            raise LaunchFailed(f"gang {gang['name']} after its stop: {'; '.join(agreed['problems'])}",
                               rollback=_relaunch_after_stop(params, agreed["relaunch"], spec), **done)
    before = _links(params)
    try:
        if params["stage_models"]:
            phase("stage model")
            done["staged"] = _stage(params, done)
        phase("launch")
        result = _launch(params, False, done)
        if params["gang_health"]:
            _gang_launched(params, result)
        return result
    except LaunchFailed as err:
        if not params["rollback_on_failure"]:
            raise
        phase("rollback")
        err.details["rollback"] = _rollback(params, err, before, exclude, spec)
        raise


def newest_complete(params):
    """The newest complete checkpoint in the run's directory, as this CT sees it now."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoints

    done = checkpoints.Directory(params["checkpoint_dir"], params["checkpoint_format"],
                                 params["checkpoint_custom"]).complete()
    return os.path.join(params["checkpoint_dir"], done[-1][0]) if done else None


def _gang_launched(params, result):
    """A CT of a gang whose own launch was healthy waits until every other CT's launch said how it
    went: one that failed fails this one too, its healthy run included, so that the gang rolls back
    whole (raises LaunchFailed); one that says nothing within the health wait leaves it as it is."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import launch

    failed = launch.gang_outcome(params["gang_health"], params["health_timeout"] + params["throughput_timeout"])
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


def _relaunch_after_stop(params, relaunch, spec):
    """After a gang's stop phase failed: the release of before (the push activated nothing) again
    from the checkpoint every CT sees, when every CT's run is gone; else nothing, said."""
    if not relaunch["relaunch"]:
        return {"after_stop": True, "failed": True, "msg": f"not relaunched: {relaunch['why']}"}
    try:
        again = _relaunch(params, spec)
    except LaunchFailed as err:
        return {"after_stop": True, "failed": True, "msg": err.msg, "relaunch": dict(err.details, failed=True, msg=err.msg)}
    return {"after_stop": True, "relaunch": again,
            "msg": f"the release of before runs again from {relaunch['checkpoint']}: {again['msg']}"}


def _relaunch(params, spec):
    """The launch of the release current points to (the one of before), resuming from the newest
    checkpoint; a gang's in a rendezvous of its own (rollback_launch). spec: the run's spec as this
    job found it (run.json, before its launch): the run goes back on its own last healthy launch's
    settings, not this job's, which may be what failed; the result says which (settings)."""
    other = params["rollback_launch"]
    if spec is not None:
        again = run_spec.relaunch_params(spec, other and other["gang_health_dir"])
        again["lifecycle"]["dir"] = params["lifecycle"]["dir"]
        settings = run_spec.settings_words(spec, params)
    else:
        again = run_spec.relaunch_options(params)
        settings = "this job's settings (the CT keeps none of an earlier launch)"
        if other:
            again["wrapper_script"] = other["wrapper_script"]
            if params["gang_health"] and other["gang_health_dir"]:
                again["gang_health"] = dict(params["gang_health"], dir=other["gang_health_dir"])
    try:
        return dict(_launch(again, False, {}), settings=settings)
    except LaunchFailed as err:
        err.details["settings"] = settings
        raise


def _links(params):
    """current and previous of the release base before the launch moves them."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import releases

    base = (params["activate"] or {}).get("base")
    if not base:
        return None
    return {name: releases.link_target(os.path.join(base, name)) for name in ("current", "previous")}


def _stage(params, done):
    """The models staged into shared memory between the stop and the launch (model_stage's work)."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import model_stage
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding

    wanted = params["stage_models"]
    progress_file = wanted["progress_file"] or os.path.join(_state_dir(params), "stage.progress.json")
    try:
        changed, models, msg = model_stage.stage_all(
            wanted["models"], wanted["reserve_gb"], wanted["workers"], progress_file,
            lambda: trainer_finding.running(params["pidfile"], params["pattern"]))
    except model_stage.StageRefused as err:
        raise LaunchFailed(f"model staging failed, nothing was started: {err}",
                           staged={"failed": True, "msg": str(err), "models": err.models}, **done) from None
    return {"changed": changed, "models": models, "msg": msg}


ROLLBACK_LADDER = [{"signal": "SIGTERM", "scope": "tree", "wait": 30}, {"signal": "SIGKILL", "scope": "tree", "wait": 10}]


def _rollback(params, failed, before, exclude, spec):
    """After a failed launch: the failed trainer stopped if it still runs (no checkpoint of it is
    wanted), current and previous set back to what they were, and the release of before relaunched,
    resuming from the newest checkpoint (the stop's). Returns what each step did; a step that fails
    ends it with failed and msg."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import releases
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop, stop_options

    done = {}
    if failed.details.get("running"):
        try:
            options = stop_options.checked(dict(
                params["stop_first"] or {"pidfile": params["pidfile"], "pattern": params["pattern"]},
                ladder=ROLLBACK_LADDER, no_graceful="proceed", on_missing_checkpoint="proceed", detach=False,
                signal_at=None), "rollback stop")
        except stop_options.InvalidParameter as err:
            return dict(done, failed=True, msg=str(err))
        options.exclude_pids.update(exclude)
        done["stop"] = staged_stop.run_in_module(options)
        if done["stop"].get("failed"):
            return dict(done, failed=True, msg=f"the failed trainer could not be stopped: {done['stop'].get('msg')}")
    if before is not None:
        base = params["activate"]["base"]
        try:
            changed = releases.restore(base, before["current"], before["previous"])
        except (releases.ReleaseError, OSError) as err:
            return dict(done, failed=True, msg=f"restoring current and previous failed: {err}")
        done["restored"] = dict(before, changed=changed)
    try:
        done["relaunch"] = _relaunch(params, spec)
    except LaunchFailed as err:
        return dict(done, failed=True, msg=f"{err.msg} (on {err.details['settings']})",
                    relaunch=dict(err.details, failed=True, msg=err.msg))
    done["msg"] = f"rolled back: {done['relaunch']['msg']}, on {done['relaunch']['settings']}"
    return done


def outcome_words(result, running_words):
    """The transaction's result in one line, for the CT's record: what it did, then what runs."""
    words = result.get("msg") or "no message"
    rollback = result.get("rollback")
    if rollback is not None:
        words += f"; rollback failed: {rollback.get('msg')}" if rollback.get("failed") else f"; {rollback.get('msg')}"
    return f"{words}; {running_words}" if result.get("failed") else words


def _launch(params, check_mode, done):
    """The launch of params after its stop and staging (done: their results, carried by every
    later result); returns the task's result, or raises LaunchFailed."""
    # only a call that launches pays for importing these (the preflight's without a launch does not)
    from ansible_collections.dflash.lifecycle.plugins.module_utils import preflight
    from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoints
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import releases, rundir
    from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import launch
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding

    refused = preflight.launch_refusals(params, probe=not check_mode)
    if refused:
        raise LaunchFailed(f"{'; '.join(refused)}; nothing was started", refused=refused, **done)
    try:
        written = launch.prepare_run(params, check_mode=check_mode)
    except (rundir.UnsafePath, OSError) as err:
        raise LaunchFailed(f"run directory: {err}", **done) from None
    done["written"] = written
    running = trainer_finding.running(params["pidfile"], params["pattern"]) if params["refuse_busy"] else None
    if running is not None:
        raise LaunchFailed(f"a trainer is already running: PID {running.pid} ({running.cmdline[:200]}); stop it first",
                           pid=running.pid, **done)
    short = launch.free_space_short(params["checkpoint_dir"], params["min_free_gb"])
    if short:
        raise LaunchFailed(f"checkpoint_dir: {short}; nothing was started", **done)
    try:
        launch.reader_of(params)
    except (ValueError, re.error) as err:
        raise LaunchFailed(f"step_regex/throughput_patterns/profile_*_regex: {err}", **done) from None
    if params["refuse_busy"]:
        done["gpu_wait"] = _wait_for_gpus(params, check_mode, done)
    try:
        prepared = launch.prepare_resume(params, check_mode)
    except checkpoint_formats.InvalidLayout as err:
        raise LaunchFailed(f"{err}; nothing was started", **done) from None
    except checkpoints.ResumeRefused as err:
        raise LaunchFailed(str(err), **done, **err.details) from None
    except OSError as err:
        raise LaunchFailed(f"checkpoint_dir: moving an incomplete checkpoint aside failed: {err}; "
                           "nothing was started", **done) from None
    if prepared is not None:
        done.update(resume=prepared["resume"], moved_aside=prepared["moved"])
    wanted = params["activate"]
    if wanted:
        try:
            done["activated"] = releases.switch(wanted["base"], wanted["release"], wanted["legacy_links"], check_mode)
        except (releases.ReleaseError, OSError) as err:
            raise LaunchFailed(f"activate: {err}", **done) from None
    if check_mode:
        return dict(changed=True, msg=f"would start {' '.join(params['command'])}", **done)
    # the release the run is, for the line at the head of its log (the throughput chart's)
    base = (wanted or {}).get("base") or params["release_base"]
    params["release"] = (wanted or {}).get("release") or (
        releases.link_target(os.path.join(base, "current")) if base else None)
    try:
        result = launch.start(params, prepared)
    except launch.LaunchError as err:
        if wanted:  # never a rollback target again (trainer_release rollback refuses it)
            releases.record_launch(wanted["base"], wanted["release"], str(err).splitlines()[0])
        raise LaunchFailed(str(err), **done, **err.details) from None
    except rundir.UnsafePath as err:
        raise LaunchFailed(f"pidfile: {err}", **done) from None
    if wanted:
        releases.record_launch(wanted["base"], wanted["release"])
    rundir.write_launch_record(params["pidfile"], dict(
        {key: result[key] for key in ("pid", "run_id", "step", "first_progress_s", "healthy_after_s")},
        tokens_per_s=(result["throughput"] or {}).get("tokens_per_s"), release=(wanted or {}).get("release")))
    lifecycle = params.get("lifecycle") or {}
    if lifecycle.get("dir"):
        # what the CT's Proxmox hook needs to stop this run and bring it back (module_utils/pve_hook.py)
        from ansible_collections.dflash.lifecycle.plugins.module_utils import pve_hook

        try:
            run_spec.record_launch(lifecycle, params, result["pid"])
            pve_hook.write_agent(lifecycle["dir"])
        except OSError as err:
            result["lifecycle_error"] = (f"lifecycle.dir: {err}; the CT's Proxmox hook cannot stop or relaunch "
                                         "this run")
    return dict(changed=True, msg=f"trainer PID {result['pid']} healthy", **done, **result)


def _wait_for_gpus(params, check_mode, done):
    """Wait (a check run: look once) until the GPUs the run needs are free; fail naming each
    GPU still used, its memory and its holders."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import rundir
    from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import gpu_memory

    nvidia_smi = params["nvidia_smi"]
    report = rundir.ProgressFile(params.get("progress_file"))
    try:
        return gpu_memory.wait_free(
            params["gpus"], params["gpu_free_threshold_mib"], 0 if check_mode else params["gpu_free_timeout"],
            read=lambda: gpu_memory.read_gpus(nvidia_smi) if params["gpus"] else {},
            holders=lambda: gpu_memory.device_holders(params["device_paths"]), report=report)
    except gpu_memory.GpuQueryError as err:
        raise LaunchFailed(f"gpus: cannot read the GPUs' memory ({err}); set nvidia_smi, or gpus to [] to skip "
                           "the memory check; nothing was started", **done) from None
    except gpu_memory.GpusBusy as err:
        raise LaunchFailed(str(err), **done, **err.details) from None
    finally:
        report.close()


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
    result = staged_stop.run_in_module(options)
    if result.get("failed"):
        raise LaunchFailed(f"the stop failed, nothing was started: {result.get('msg')}", stop=result)
    return result
