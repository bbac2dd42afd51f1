# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch as one call inside the CT: the stop first (stop_first), the run directory, the
refusals, the wait for free GPUs, the resume, the activation, the start and the health wait.

Both modules that launch run it: trainer_process as its whole work, and trainer_preflight after its
checks (its ``launch`` option), so a CT that runs alone is preflighted, stopped and relaunched in
one round trip when nothing is to be pushed or staged in between. ARGUMENT_SPEC is
trainer_process's (its DOCUMENTATION documents it), less the lock's options.
"""

from __future__ import annotations

import os
import re

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_formats
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import progress

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
    if validated.error_messages:
        raise InvalidLaunch("; ".join(f"{where}: {message}" for message in validated.error_messages))
    # the secret values AnsibleModule itself takes from its own validation (basic.py reads the same)
    return validated.validated_parameters, validated._no_log_values


def deferred(check_mode, release, preflight):
    """Why a launch asked of the preflight's call cannot run in it, or None: what redeploy.yml does
    between the checks and the launch - the push of a release not installed (trainer_code's push.yml),
    the staging of a model (trainer_model's stage.yml). release: the preflight's release option;
    preflight: its result."""
    if check_mode:
        return "check mode: the launch's own task reports what it would do"
    if release and not preflight["release_status"]["present"]:
        return f"release {release['release']} is to be pushed first"
    if preflight["model_stage_needed"]:
        return "a model is to be staged between the stop and the launch"
    return None


def run(params, check_mode, warn):
    """The launch of params (ARGUMENT_SPEC's, validated); returns the task's result, or raises
    LaunchFailed."""
    # only a call that launches pays for importing these (the preflight's without a launch does not)
    from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoints
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import releases, rundir
    from ansible_collections.dflash.lifecycle.plugins.module_utils.launch import launch
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding

    stopped = _stop_first(params, check_mode, warn)
    # every later result carries the stop's: what the report and a rescue read
    done = {"stop": stopped} if stopped is not None else {}
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


def _stop_first(params, check_mode, warn):
    """The stop before the launch (stop_first); raises LaunchFailed when it did not end as asked.
    Returns its result, or None when there is none to run."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop, stop_options

    if not params["stop_first"] or check_mode:
        return None
    try:
        options = stop_options.checked(params["stop_first"], "stop_first")
    except stop_options.InvalidParameter as err:
        raise LaunchFailed(f"{err}; nothing was stopped or started") from None
    result = staged_stop.run_in_module(options)
    for note in result.get("notes", []):
        warn(note)
    if result.get("failed"):
        raise LaunchFailed(f"the stop failed, nothing was started: {result.get('msg')}", stop=result)
    return result
