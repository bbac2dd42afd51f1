#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: trainer_preflight
short_description: Check a CT can run the DFlash trainer, in one round trip
version_added: 0.1.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Runs inside the CT. Checks that C(nvidia-smi -L) lists enough GPUs, that the target model
    directory holds a C(config.json) (it usually lives in C(/dev/shm), which a CT restart
    wipes), that the data directory is not empty and that the checkpoint directory has enough
    free space, and, with O(trainer_script), that the trainer to launch is installed. Every check
    is reported with the value found; every failing one is named.
  - Also checks that O(checkpoint_format) matches what O(output_dir) holds (a layout set that
    claims nothing in a directory holding another layout's checkpoints, or a custom pattern that
    matches nothing in a directory holding files, fails naming what it holds and the layout that
    would match), and reports the layout, the newest complete checkpoint and what the trainer's
    resume would load (RV(checkpoint)).
  - With O(launch), once every check passed and nothing is to be done between the checks and the
    launch - O(release) is installed already, no model is to be staged - it launches in the same
    call, exactly as M(dflash.lifecycle.trainer_process) with those options does, its stop first
    included (RV(launch)). C(redeploy.yml) does this for a CT that runs alone, whose command line
    depends on nothing the checks find; the whole redeploy is then one round trip into the CT.
options:
  target_model:
    description: Target model directory.
    type: path
    required: true
  data_dir:
    description: Training data directory.
    type: path
    required: true
  output_dir:
    description: Checkpoint directory (may not exist yet).
    type: path
    required: true
  gpus_needed:
    description: Number of GPUs the CT must show (highest GPU id used plus one).
    type: int
    default: 0
  privileged:
    description:
      - What a privileged CT (its root is the node's root) gets - V(warn) (the check passes, RV(privileged)
        says so and the action plugin warns) or V(refuse) (the check fails before anything is touched).
      - Read from the CT's own user namespace map, the CT's word - a privileged CT's root is root on the
        node anyway; C(make status) shows what the node's configuration says.
    type: str
    choices: [warn, refuse]
    default: warn
  min_free_gb:
    description: Free space needed at O(output_dir), in GiB.
    type: float
    default: 10
  nvidia_smi:
    description:
      - The nvidia-smi command, by absolute path (the NVIDIA driver installs it in C(/usr/bin);
        C(pct exec) runs commands with PATH=/sbin:/bin:/usr/sbin:/usr/bin).
    type: path
    default: /usr/bin/nvidia-smi
  trainer_script:
    description: The trainer script a launch would run; missing means no release is installed.
    type: path
  stop_request:
    description:
      - The stop request's file the launch gives the run - its directory must be one the stop can
        write (missing, only the run directory, which the launch creates), the path itself no
        directory or symlink.
    type: dict
    suboptions:
      path:
        description: The file (C(trainer_run_stop_request_path)).
        type: path
        required: true
      run_dir:
        description: The run directory (C(trainer_run_dir)).
        type: path
        required: true
  launcher:
    description:
      - The launcher the run starts with - checks that O(launcher.python) has torch (and accelerate or
        deepspeed), and reads from the torch package's own files, without importing it, its version
        and whether its launcher reads a shutdown timeout (RV(launcher)).
    type: dict
    suboptions:
      name:
        description: The launcher.
        type: str
        required: true
        choices: [torchrun, accelerate, deepspeed]
      python:
        description: The interpreter the launch runs it with.
        type: str
        required: true
      env:
        description:
          - The run's environment (C(dflash_env)), exported before the probe as the launch's
            wrapper does, so that a torch found through it (a PYTHONPATH, a venv's PATH) is found.
        type: dict
        default: {}
      secrets_file:
        description: The run's secrets file, sourced before the probe when it exists, as the wrapper does.
        type: path
      login_shell:
        description: Run the probe through C(bash -l), as the launch runs the wrapper with C(trainer_launch_login_shell).
        type: bool
        default: false
  gang_marks:
    description:
      - For a CT of a gang - proves that its CTs share O(output_dir). This CT writes its mark,
        C(<output_dir>/.dflash-gang/<job>/<me>), and waits up to O(gang_marks.wait) seconds for
        every member's mark (the gang's preflights run at the same time). The result's
        C(checkpoint.gang_marks) lists the members seen and missing; a gang's barrier refuses
        the gang when one is missing. Nothing is written in check mode.
    type: dict
    suboptions:
      job:
        description: The job's id, the same on every CT of the gang (its rendezvous id).
        type: str
        required: true
      me:
        description: This CT's name in the gang.
        type: str
        required: true
      members:
        description: Every CT of the gang.
        type: list
        elements: str
        required: true
      wait:
        description: Seconds to wait for the other members' marks.
        type: float
        default: 10
  model_stage:
    description:
      - Models staged into shared memory from their persistent copies before the launch
        (M(dflash.lifecycle.model_stage)). Checked here, before anything is touched - each a model
        directory, each target in a tmpfs, each fitting beside O(model_stage.reserve_gb) in what the
        CT's memory can take - and a missing O(target_model) that will be staged passes its check.
    type: dict
    suboptions:
      models:
        description: The path the trainer loads, mapped to its persistent copy.
        type: dict
        required: true
      reserve_gb:
        description: Memory (GB) kept free beside the model for the trainer's own host memory.
        type: float
        default: 32
      after_stop:
        description:
          - Whether the job stops the running trainer before it stages the model (a redeploy, a
            rollback). Without, a running trainer refuses a model to stage (a start).
        type: bool
        default: true
  trainer:
    description: How to find a running trainer, to report it (RV(trainer_running)).
    type: dict
    suboptions:
      pidfile:
        description: Its pidfile.
        type: path
      pattern:
        description: Regex on its command line, for a trainer without a pidfile.
        type: str
  change_record:
    description:
      - The CT's record of the last change a job made to the run (written by the CT's worker). A
        change that ended without its controller, or whose worker died, is reported once in
        RV(unattended_change), and marked as reported by this job (not in check mode).
    type: path
    default: /var/lib/dflash/last-change.json
  lifecycle_dir:
    description:
      - The CT's lifecycle directory (the launch's C(lifecycle.dir)). The ends of the run its supervisor
        restarted after since the last job asked are reported once in RV(supervisor_restarts), and marked as
        reported by this job (not in check mode).
    type: path
  throughput:
    description:
      - Read the running trainer's recent throughput from its log (the throughput canary's
        "before"), the way M(dflash.lifecycle.trainer_process) reads the new run's.
    type: dict
    suboptions:
      log_file:
        description: Its log.
        type: path
        required: true
      lines:
        description: The median is over its last this many progress lines.
        type: int
        default: 5
      warmup_lines:
        description: Progress lines at the start of the log left out.
        type: int
        default: 1
      step_regex:
        description: Regex whose first group is the step number of a progress line.
        type: str
        default: \bstep[\s:=#]*(\d+)\b
      throughput_patterns:
        description: Regexes of the throughput figure (a group named C(value), an optional C(unit)).
        type: list
        elements: str
        default:
          - \btok(?:en)?s?/s\s*[=:]?\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[KkMm](?![A-Za-z]))?
          - (?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[KkMm])?\s*tok(?:en)?s?/s\b
      profile_line_regex:
        description: Regex of the trainer's ProfileStats lines.
        type: str
        default: ProfileStats
      profile_stage_regex:
        description: Regex of one stage in such a line (groups C(stage), C(avg), C(max)).
        type: str
        default: (?P<stage>[A-Za-z_][\w.-]*) avg (?P<avg>\d+(?:\.\d+)?)\s*ms max (?P<max>\d+(?:\.\d+)?)\s*ms
  release:
    description:
      - Also read the releases installed under O(release.base) and compare the current one with
        this release's manifest, as M(dflash.lifecycle.trainer_release) V(status) does, in the same
        round trip. C(redeploy.yml) sets it through C(module_defaults), and hands RV(release_status)
        to the trainer_code role, which then reads nothing itself.
    type: dict
    suboptions:
      base:
        description: Release directory in the CT.
        type: path
        required: true
      release:
        description: Id of the release about to be pushed.
        type: str
        required: true
      files:
        description: Its manifest (path to mode and sha256), as M(dflash.lifecycle.release_manifest) returns it.
        type: dict
        required: true
      on_drift:
        description:
          - When an installed release (current, previous, or this one) no longer matches its
            manifest - V(repair) reports it (RV(release_status)) and lets the push reinstall
            this release; V(fail) fails here, listing the files, before anything is touched.
        type: str
        choices: [repair, fail]
        default: repair
  writable:
    description:
      - Directories the run writes (its checkpoints, its log's, its run and lifecycle directories, where a model
        is staged), by the name the failure gives each (the variable that sets it). Each must be writable by root
        in the CT, as the trainer runs; a file is created there and removed (in check mode, C(access(2)) is
        asked). A missing one counts as the nearest directory above it that exists.
      - A failure is one line naming the directory, its owner as the CT sees it and the fix - in an unprivileged
        CT a mount point from the node that the node's root owns shows as C(nobody), and the fix is a C(chown) on
        the node to the CT's root as the node sees it, or an id map.
    type: dict
    default: {}
  tools:
    description:
      - Binaries the job pushes into the CT when it lacks them (py-spy, for a hang's stacks), each by its
        path in the CT, its SHA-256 and size on the controller. Those missing or of another version are
        named in RV(tools_missing), their directories made (outside check mode) for the push.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Where the tool goes in the CT., type: path, required: true}
      sha256: {description: Its SHA-256 on the controller., type: str, required: true}
      size: {description: Its size in bytes on the controller., type: int, required: true}
  launch:
    description:
      - The options of M(dflash.lifecycle.trainer_process), validated as that module validates them,
        without its C(lock_*) options (this module's own lock covers the launch too). Run in this
        call, after the checks, when every check passed, O(release) (when set) is installed already
        and no model is to be staged (RV(model_stage_needed)); else RV(launch_deferred) says why,
        nothing is stopped or started, and the job goes on as without it.
      - A launch that ran ends the task as M(dflash.lifecycle.trainer_process) ends its own - a
        failed one (the stop before it included) fails the task with the launch's result in
        RV(launch) - and with O(lock_unlock) gives the lock back; a deferred one keeps the lock
        for the job's next steps.
      - Ignored in check mode (RV(launch_deferred)), where the launch's own task reports what it
        would do.
    type: dict
extends_documentation_fragment:
  - dflash.lifecycle.checkpoint_format
  - dflash.lifecycle.redeploy_lease
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: none
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Only reads.
  diff_mode:
    support: partial
    details: With O(release), the file list of the current release against the new one when that one is not installed yet.
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Preflight
  dflash.lifecycle.trainer_preflight:
    target_model: /dev/shm/models/target
    data_dir: /workspace/data
    output_dir: /workspace/checkpoints
    gpus_needed: 8
"""

RETURN = r"""
lock:
  description: >-
    The redeploy lock this task ran under (holder, since and expires as epoch seconds,
    taken_over_from, msg, released), also when it failed after taking it.
  returned: when O(lock_holder) is set
  type: dict
checks:
  description: Each check with C(ok), C(found) and a C(hint).
  returned: always
  type: list
  elements: dict
privileged:
  description: >-
    Whether the CT is privileged - its root is the node's root, so nothing contains it (docs/security.md) -
    by its user namespace's map.
  returned: always
  type: bool
gpu_count:
  description: GPUs listed by C(nvidia-smi -L).
  returned: always
  type: int
launcher:
  description: >-
    The torch the launcher runs - C(path), C(version), C(reads_shutdown_timeout) (whether its
    launcher reads C(--shutdown-timeout) and C(TORCH_ELASTIC_SHUTDOWN_TIMEOUT); older ones
    hard-code 30 s) and C(error); null without O(launcher).
  returned: always
  type: dict
  sample: {path: /opt/venv/lib/python3.11/site-packages/torch, version: 2.13.0+cpu, reads_shutdown_timeout: true, error: null}
checkpoint_present:
  description: Whether a complete checkpoint exists in O(output_dir).
  returned: always
  type: bool
checkpoint:
  description: >-
    What O(output_dir) holds by its layout - C(format) and C(format_reason) (for V(auto), what it
    was recognised by; null while the directory holds no checkpoint), C(newest) and C(newest_step)
    (the newest complete checkpoint), C(incomplete) (the names of incomplete ones), C(resume)
    (what the trainer's resume rule would load, as M(dflash.lifecycle.staged_stop) reports it),
    C(listing) (each checkpoint's size in bytes and completeness: named when a gang's CTs do not
    share the directory) and, with O(gang_marks), C(gang_marks) (C(dir), C(seen), C(missing),
    C(waited_s), C(checked)).
  returned: when the layout check passed
  type: dict
  sample: {format: deepspeed, format_reason: "auto: 2 entries like global_step200", newest: global_step200,
           newest_step: 200, incomplete: [], resume: {name: global_step200, step: 200, complete: true,
           path: /workspace/checkpoints/global_step200, problems: [], rule: the tag latest names},
           listing: {global_step200: [1048576, true]}}
model_stage:
  description: >-
    With O(model_stage), each model's plan as M(dflash.lifecycle.model_stage)
    RV(dflash.lifecycle.model_stage#module:models) has it (C(needed), C(bytes), C(fits), ...); else null.
  returned: always
  type: list
  elements: dict
model_stage_needed:
  description: Whether a model is to be staged before the launch.
  returned: always
  type: bool
trainer_running:
  description: Whether a trainer runs (found as O(trainer) says).
  returned: when trainer is set
  type: bool
trainer_pid:
  description: Its PID, or null.
  returned: when trainer is set
  type: int
throughput_before:
  description: >-
    The running trainer's median tok/s over its last progress lines and its per-stage timings, as
    M(dflash.lifecycle.trainer_process) RV(dflash.lifecycle.trainer_process#module:throughput) has
    them (C(tokens_per_s) null when its log has no progress line). They are read from the log the
    trainer's progress goes to: of the regular files its run holds open for writing, the newest
    written whose tail has a step, else O(throughput.log_file) when written since the trainer started
    (C(log): C(path), C(source), C(configured), C(why); C(log_words) says it when that is not simply
    O(throughput.log_file), or that no log of this run is known).
  returned: when throughput is set and a trainer runs
  type: dict
launch:
  description: >-
    With O(launch), the launch's result as M(dflash.lifecycle.trainer_process) returns it (C(pid),
    C(stop), C(throughput), C(activated), C(resume), ...; C(failed) and C(msg) when it failed), or
    null when it was deferred.
  returned: when O(launch) is set
  type: dict
unattended_change:
  description: >-
    The last change to the run when its controller did not see it end (a redeploy whose controller was
    killed or cancelled after the first signal: the CT's worker finished it), in one line; null otherwise.
  returned: always
  type: str
  sample: "the redeploy started at 2026-12-05 20:19:40 UTC by root@vm ansible-playbook pid 15973 finished without
    its controller at 2026-12-05 20:19:47 UTC: trainer PID 4242 healthy"
tools_missing:
  description: The paths of O(tools) the CT lacks or holds in another version.
  returned: always
  type: list
  elements: str
supervisor_restarts:
  description: >-
    The ends of the run its supervisor saw since the last job asked (crashes, hangs, failed relaunches) and what
    it did, in one line; null when there were none.
  returned: always
  type: str
  sample: "the supervisor saw 1 end(s) of the run since the last job: 2026-12-05 20:31:02 UTC crash: the trainer
    killed by SIGKILL -> trainer PID 812 healthy, resumed from /workspace/ckpt/step_2000; now: watching"
launch_deferred:
  description: Why O(launch) was not run in this call (a release to push, a model to stage, check mode), or null.
  returned: when O(launch) is set
  type: str
release_status:
  description: >-
    What M(dflash.lifecycle.trainer_release) V(status) returns for O(release) - C(present),
    C(current), C(previous), C(releases), C(drift), C(launch_failures), C(current_files),
    C(current_manifest) and C(changes) (C(added), C(removed), C(modified)).
  returned: when O(release) is set
  type: dict
"""

import os
import re

from ansible_collections.dflash.lifecycle.plugins.module_utils import leased, preflight
from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import launch_options, policy
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_formats
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import change_record, model_stage, proctable, progress, releases
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import trainer_finding


def main():
    module = leased.LeasedModule(
        phase="preflight",
        argument_spec={
            "target_model": {"type": "path", "required": True},
            "data_dir": {"type": "path", "required": True},
            "output_dir": {"type": "path", "required": True},
            "gpus_needed": {"type": "int", "default": 0},
            "privileged": {"type": "str", "choices": ["warn", "refuse"], "default": "warn"},
            "min_free_gb": {"type": "float", "default": 10},
            **checkpoint_formats.ARGUMENT_SPEC,
            "nvidia_smi": {"type": "path", "default": "/usr/bin/nvidia-smi"},
            "trainer_script": {"type": "path"},
            "stop_request": {"type": "dict", "options": {
                "path": {"type": "path", "required": True},
                "run_dir": {"type": "path", "required": True},
            }},
            "launcher": {"type": "dict", "options": {
                "name": {"type": "str", "required": True, "choices": ["torchrun", "accelerate", "deepspeed"]},
                "python": {"type": "str", "required": True},
                "env": {"type": "dict", "default": {}},
                "secrets_file": {"type": "path"},
                "login_shell": {"type": "bool", "default": False},
            }},
            "model_stage": {"type": "dict", "options": {
                "models": {"type": "dict", "required": True},
                "reserve_gb": {"type": "float", "default": 32},
                "after_stop": {"type": "bool", "default": True},
            }},
            "trainer": {"type": "dict", "options": {
                "pidfile": {"type": "path"},
                "pattern": {"type": "str"},
            }},
            "change_record": {"type": "path", "default": change_record.DEFAULT_PATH},
            "lifecycle_dir": {"type": "path"},
            "gang_marks": {"type": "dict", "options": {
                "job": {"type": "str", "required": True},
                "me": {"type": "str", "required": True},
                "members": {"type": "list", "elements": "str", "required": True},
                "wait": {"type": "float", "default": 10},
            }},
            "throughput": {"type": "dict", "options": {
                "log_file": {"type": "path", "required": True},
                "lines": {"type": "int", "default": 5},
                "warmup_lines": {"type": "int", "default": 1},
                "step_regex": {"type": "str", "default": progress.STEP_REGEX},
                "throughput_patterns": {"type": "list", "elements": "str",
                                        "default": list(progress.THROUGHPUT_PATTERNS)},
                "profile_line_regex": {"type": "str", "default": progress.PROFILE_LINE_REGEX},
                "profile_stage_regex": {"type": "str", "default": progress.PROFILE_STAGE_REGEX},
            }},
            "release": {"type": "dict", "options": {
                "base": {"type": "path", "required": True},
                "release": {"type": "str", "required": True},
                "files": {"type": "dict", "required": True},
                "on_drift": {"type": "str", "choices": ["repair", "fail"], "default": "repair"},
            }},
            "launch": {"type": "dict"},
            "writable": {"type": "dict", "default": {}},
            "tools": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "path", "required": True},
                "sha256": {"type": "str", "required": True},
                "size": {"type": "int", "required": True},
            }},
        },
        supports_check_mode=True,
    )
    with module.lock_given_back_on_a_crash():
        check(module)


def _unattended_change(module):
    """The last change to the run in words when no controller saw it end and no job reported it
    yet; this job reports it (marked, outside check mode)."""
    record = change_record.read(module.params["change_record"])
    if not record or record.get("reported") or (record.get("finished_at") and record.get("controller") != "gone"):
        return None  # the common case, read without importing what the rest needs
    from ansible_collections.dflash.lifecycle.plugins.module_utils import trainer_state

    trainer = module.params["trainer"] or {}
    last = trainer_state.last_change(module.params["change_record"],
                                     os.path.dirname(trainer.get("pidfile") or "/run/dflash/trainer.pid"))
    if not last["unattended"]:
        return None
    if not module.check_mode:
        try:
            change_record.update(module.params["change_record"], reported=module.params["lock_holder"] or True)
        except OSError as err:
            module.warn(f"change_record: cannot mark it reported: {err}")
    return last["words"]


def check(module):
    """The checks, the launch when one is asked and nothing is to be done before it, and the
    module's answer."""
    launch = None
    if module.params["launch"] is not None:
        try:
            launch, secrets = launch_options.checked(module.params["launch"], "launch")
        except launch_options.InvalidLaunch as err:
            module.fail_json(msg=f"{err}; nothing was checked, stopped or started")
        module.no_log_values.update(secrets)
    result = preflight.preflight(module.params, module.check_mode)
    result["unattended_change"] = _unattended_change(module)
    result["tools_missing"] = preflight.missing_tools(module.params["tools"], module.check_mode)
    result["supervisor_restarts"] = policy.restarts_since(
        module.params["lifecycle_dir"], mark=not module.check_mode) if module.params["lifecycle_dir"] else None
    if module.params["gang_marks"] and result["checkpoint"] is not None:
        result["checkpoint"]["gang_marks"] = preflight.gang_marks(module.params["output_dir"],
                                                                  module.params["gang_marks"], module.check_mode)
    if module.params["trainer"]:
        running = trainer_finding.running(module.params["trainer"]["pidfile"], module.params["trainer"]["pattern"])
        result.update(trainer_running=running is not None, trainer_pid=running.pid if running else None)
        wanted_figures = module.params["throughput"]
        if wanted_figures and running is not None:
            try:
                reader = progress.LogReader(wanted_figures["step_regex"], wanted_figures["throughput_patterns"],
                                            wanted_figures["profile_line_regex"], wanted_figures["profile_stage_regex"])
            except (ValueError, re.error) as err:
                module.fail_json(msg=f"throughput: {err}")
            # the log the running trainer's progress goes to, which may not be log_file
            log = progress.running_log(running, wanted_figures["log_file"], step_regex=wanted_figures["step_regex"])
            result["throughput_before"] = reader.window(progress.read_lines(log["path"]),
                                                        wanted_figures["lines"], wanted_figures["warmup_lines"])
            result["throughput_before"].update(log=log, log_words=progress.log_words(log))
    if result["model_stage_needed"]:
        # a model is replaced only after the stop: any user but the trainer the job stops refuses it now
        stopped = set()
        if module.params["trainer"] and result.get("trainer_pid") and module.params["model_stage"]["after_stop"]:
            stopped = {result["trainer_pid"], *proctable.descendants(proctable.snapshot(), result["trainer_pid"])}
        elif module.params["trainer"] and result.get("trainer_pid"):
            result["checks"].append(dict(check="model_stage", ok=False, found=(
                f"a model is to be staged and the trainer PID {result['trainer_pid']} runs"),
                hint="this job does not stop it: `make restart` stops it, then stages the model"))
            result["failed_checks"].append(result["checks"][-1])
        for plan in result["model_stage"]:
            users = [u for u in model_stage.users_of([plan["target"]]) if u["pid"] not in stopped] if plan["needed"] else []
            if users:
                result["checks"].append(dict(check="model_stage", ok=False, hint="", found=(
                    model_stage.in_use(plan["target"], users) + ", which is not the trainer this job stops: it is "
                    "not replaced under them")))
                result["failed_checks"].append(result["checks"][-1])
    wanted = module.params["release"]
    if wanted:
        result["release_status"] = releases.compared(wanted["base"], wanted["release"], wanted["files"])
        diff = result["release_status"].pop("diff", None)
        if diff and module._diff:
            result["diff"] = diff
    failed = result.pop("failed_checks")
    drift = (result.get("release_status") or {}).get("drift")
    if drift and wanted["on_drift"] == "fail":
        module.fail_json(msg="installed releases changed in place (on_drift=fail): " + "; ".join(
            f"{rid}: " + ", ".join(f"{kind} {', '.join(files)}" for kind, files in found.items() if files)
            for rid, found in sorted(drift.items())) + ". Nothing was touched.", **result)
    if failed:
        module.fail_json(msg="preflight failed: " + "; ".join(
            f"{c['check']}: {c['found']}" + (f" ({c['hint']})" if c["hint"] else "")
            for c in failed), **result)
    if launch is None:
        module.exit_json(changed=False, **result)
    result["launch_deferred"] = launch_options.deferred(module.check_mode, module.params["release"], result, launch)
    if result["launch_deferred"]:
        module.params["lock_unlock"] = False  # the job's next steps run under it
        module.exit_json(changed=False, launch=None, **result)
    module.enter_phase("launch")
    # only a call that launches compiles the launch and the agent it keeps in the CT
    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import main as agent

    try:
        result["launch"] = agent.launch(launch, False, module.warn, module.worker_lease(), module.params["lock_unlock"])
    except launch_options.LaunchFailed as err:
        result["launch"] = dict(err.details, failed=True, msg=err.msg)
        module.fail_json(msg=err.msg, **result)
    module.exit_json(changed=True, **result)


if __name__ == "__main__":
    main()
