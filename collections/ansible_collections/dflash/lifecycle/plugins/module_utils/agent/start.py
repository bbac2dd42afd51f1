# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch of the trainer after its stop and staging: the preflight's rules every launch applies,
the run directory, the refusals, the wait for free GPUs, the resume, the activation, the start and
the health wait, and what the run keeps for its relaunches (its spec, the agent); the model staged
between the stop and the launch (Python 3.8 compatible).

The transaction (transaction.py) and its rollback (rollback.py) start the run through here.
"""

from __future__ import annotations

import os
import re

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import payload
from ansible_collections.dflash.lifecycle.plugins.module_utils.agent.launch_options import LaunchFailed
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_formats
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import run_spec


def stage(params, done):
    """The models staged into shared memory between the stop and the launch (model_stage's work)."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import model_stage
    from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding

    wanted = params["stage_models"]
    progress_file = wanted["progress_file"] or os.path.join((params["run_dir"] or os.path.dirname(params["pidfile"])), "stage.progress.json")
    try:
        changed, models, msg = model_stage.stage_all(
            wanted["models"], wanted["reserve_gb"], wanted["workers"], progress_file,
            lambda: trainer_finding.running(params["pidfile"], params["pattern"]))
    except model_stage.StageRefused as err:
        raise LaunchFailed(f"model staging failed, nothing was started: {err}",
                           staged={"failed": True, "msg": str(err), "models": err.models}, **done) from None
    return {"changed": changed, "models": models, "msg": msg}


def start(params, check_mode, done):
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
        done["gpu_wait"] = wait_for_gpus(params, check_mode, done)
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
    # the GPUs' UUIDs as nvidia-smi gave them to the wait for free GPUs: what DCGM's metrics name them by
    rundir.write_launch_record(params["pidfile"], dict(
        {key: result[key] for key in ("pid", "run_id", "step", "first_progress_s", "healthy_after_s")},
        tokens_per_s=(result["throughput"] or {}).get("tokens_per_s"), release=(wanted or {}).get("release"),
        gpu_uuids={str(index): uuid for index, uuid in ((done.get("gpu_wait") or {}).get("uuids") or {}).items()}))
    lifecycle = params.get("lifecycle") or {}
    if lifecycle.get("dir"):
        # what the CT's Proxmox hook needs to stop this run and bring it back (module_utils/agent/hook.py)
        try:
            run_spec.record_launch(lifecycle, params, result["pid"])
            payload.write_agent(lifecycle["dir"])
        except OSError as err:
            result["lifecycle_error"] = (f"lifecycle.dir: {err}; the CT's Proxmox hook cannot stop or relaunch "
                                         "this run")
    return dict(changed=True, msg=f"trainer PID {result['pid']} healthy", **done, **result)


def wait_for_gpus(params, check_mode, done):
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
