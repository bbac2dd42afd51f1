#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: staged_stop
short_description: Stop a training run in stages, checkpoint first, and prove it stopped
version_added: 0.1.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Finds the trainer (O(pidfile) first, else O(pattern) on the full command line) and holds
    its run before the first signal, then climbs a O(ladder) of stages.
  - The run of a trainer launched by M(dflash.lifecycle.trainer_process) is its main process,
    its descendants and every process carrying its run identity (C(DFLASH_RUN_ID) in
    C(/proc/PID/environ), inherited by DataLoader workers, spawn children and helpers
    double-forked with C(setsid -f)). A trainer started by hand has no identity; its run is
    its own tree and, with O(include_wrapper), a non-interactive shell that runs nothing else
    (C(bash run.sh)).
  - Never a target - an interactive or login shell, the rest of a session or process group, a
    process with PPID 0 (attached from outside the CT by C(pct exec)), the module's own chain.
    A GPU holder outside the run is stopped only when it is recognisably the run's leftover
    (reparented, started after the trainer, and running the trainer's own program, or named by
    O(leftover_pids) or O(leftover_pattern)). Every other GPU holder is listed in
    RV(other_gpu_holders) and never signalled.
  - The default ladder is SIGINT to the main process (its KeyboardInterrupt handler writes a
    checkpoint) with a long wait, then SIGTERM to the tree, then SIGKILL to the tree. SIGCONT
    follows every signal but SIGKILL, so stopped processes can act on it.
  - Signals go to single processes identified by (PID, start time), through pidfds where the
    kernel allows; never to a process group number. Inside a container entered with
    C(pct exec) the PGID and SID are 0, and C(kill 0) would hit the caller itself.
  - The graceful stage is the first whose signal the trainer saves on (O(saves_on)) and its main
    process catches (SigCgt in C(/proc/PID/status)). A caught signal alone is not enough - Python's
    own KeyboardInterrupt handler shows as caught, and HF Trainer, DeepSpeed, torchtitan and
    SpecForge save nothing on it. Its wait is extended while the checkpoint directory keeps
    changing, up to O(graceful_wait_cap). The stages before it are skipped (their signals would
    end the trainer without a checkpoint), and a stage of scope V(main) whose signal is ignored is
    skipped unless O(skip_ignored_stage=false).
  - The first signal is never sent while a save is being written (a temporary entry, or an
    incomplete checkpoint changed within O(checkpoint_activity_window)) unless the trainer finishes
    a save on that signal; it waits for the save, up to O(graceful_wait_cap).
  - A trainer started by a launcher - torchrun (or C(python -m torch.distributed.run)), C(accelerate
    launch), the DeepSpeed launcher - is stopped by the launcher's rules (the project's
    C(module_utils/launch/launchers.py)). The main process is the agent; its workers (one per rank) are the
    trainer, whose signal handling decides the graceful stage. The agent's deadline before it
    SIGKILLs its workers is read from its command line (C(--shutdown-timeout)), its environment
    (C(TORCH_ELASTIC_SHUTDOWN_TIMEOUT), C(PET_SHUTDOWN_TIMEOUT)) and the torch it runs (older ones
    hard-code 30 s). When the agent forwards the graceful signal and its deadline covers
    O(graceful_wait_cap), the agent alone gets it (never a worker too - a second SIGINT cuts a save).
    Otherwise every worker's process group gets it at once while the agent (and DeepSpeed's runner)
    is held with SIGSTOP, so that neither its deadline nor the first rank's exit can end the others in
    their save; once the workers are gone, the agent gets SIGTERM and SIGCONT and exits without an
    elastic restart. New workers during the stop (an elastic restart) fail the task.
  - What counts as a checkpoint, its step and whether it is complete come from
    O(checkpoint_format); a quiet directory never makes one complete. The result says which
    layout was used, every checkpoint that appeared during the stop and whether it is complete,
    the newest complete one, the steps lost from it, and which checkpoint the trainer's own
    resume would load (C(resume) in RV(checkpoint)).
  - Waits without busy polling (poll() on pidfds, exited ones unregistered; the checkpoint
    directory is read at most twice a second). Stopped means every process of the set is gone;
    zombies count as gone.
  - Before escalating past the first stage it records per-thread state and wchan of the main
    process and a C(py-spy dump) when py-spy exists (skipped for a thread in D state).
  - Processes that survive the last stage make the task fail with a report of them. A stop that
    could checkpoint but wrote no sound new checkpoint fails too (O(on_missing_checkpoint)),
    stating the steps lost, the free space and the temporary files left (never deleted).
options:
  pidfile:
    description:
      - Pidfile of the trainer, C(PID), C(PID STARTTIME) or C(PID STARTTIME RUN_ID) (start time
        in clock ticks, field 22 of C(/proc/PID/stat)). A PID that now belongs to another process
        (start time differs, started after the pidfile was written, or does not match
        O(pattern)) is never signalled.
    type: path
  pattern:
    description:
      - Python regular expression searched in the full command line, used when O(pidfile) is not
        given or names no running trainer. Of a chain of matching processes (forked workers share
        the trainer's command line) only the topmost counts; a matching shell with one matching
        child stands for that child.
    type: str
  pid:
    description: Of several processes matching O(pattern), the one to stop.
    type: int
  select:
    description:
      - What to do when several processes match O(pattern). V(only) fails and lists them,
        signalling nothing.
    type: str
    choices: [only, oldest, newest]
    default: only
  include_wrapper:
    description:
      - For a trainer without a run identity, also stop its parent when that is a
        non-interactive shell whose only child is the trainer (C(bash run.sh)).
    type: bool
    default: false
  ladder:
    description:
      - Stages, in order. Scope V(main) signals the main process, V(group) the targets in its real
        process group (all targets when the PGID is 0), V(tree) every target.
    type: list
    elements: dict
    default:
      - {signal: SIGINT, scope: main, wait: 120}
      - {signal: SIGTERM, scope: tree, wait: 30}
      - {signal: SIGKILL, scope: tree, wait: 10}
  skip_ignored_stage:
    description: Skip a O(ladder) stage of scope V(main) whose signal the main process ignores.
    type: bool
    default: true
  device_glob:
    description:
      - Device files of the GPUs (a glob). Their holders outside the run are reported, and the
        run's leftovers among them are stopped. Empty to disable.
    type: str
    default: /dev/nvidia*
  leftover_pids:
    description: PIDs of GPU holders outside the run's tree to stop with it.
    type: list
    elements: int
    default: []
  leftover_pattern:
    description:
      - Regex on the command line of GPU holders outside the run's tree (reparented, started after
        the trainer) to stop with it.
    type: str
  checkpoint_dir:
    description:
      - Directory where the trainer writes checkpoints, when its command line does not say
        (O(checkpoint_dir_flag)).
    type: path
  checkpoint_dir_flag:
    description:
      - The trainer's flag that names its checkpoint directory. Where the running trainer's own
        command line has it (C(--output-dir /workspace/checkpoints) or C(--output-dir=...),
        relative to its working directory), that directory is watched and verified, whatever
        O(checkpoint_dir) says - the settings may have changed since the trainer started. Empty
        to always use O(checkpoint_dir).
    type: str
    default: --output-dir
  saves_on:
    description:
      - What makes the trainer write a checkpoint and exit - V(request) (the stop request, see
        O(request_path)), or the signal it saves on - V(SIGINT) (an C(except KeyboardInterrupt:)
        that saves, as the field's DFlash trainer has), V(SIGTERM) (a SIGTERM handler that saves,
        such as HF's C(enable_jit_checkpoint)), V(none); or V(auto) - the stop request when a
        process of the run announced in its log that it honours it, else what its checkpoint
        layout is known to do (V(step_dirs) saves on SIGINT; HF Trainer, Lightning, DeepSpeed, DCP
        and SpecForge save on none). With no layout known yet the signal it saves on is not known,
        and no stage counts as graceful.
      - V(request) asks a trainer that never announced it too, and says so; the signals after a
        request not taken are those of V(auto).
      - With no stage that saves, O(no_graceful) decides (the default waits for the next periodic
        checkpoint to be complete, then stops).
    type: str
    choices: [auto, request, SIGINT, SIGTERM, none]
    default: auto
  checkpoint_temp_patterns:
    description:
      - Globs of temporary names. Such entries are not checkpoints, and a checkpoint directory
        holding one is not complete.
    type: list
    elements: str
    default: [".tmp*", "*.tmp", "*.tmp-*", "*.partial", "*.incomplete"]
  checkpoint_activity_window:
    description:
      - The graceful stage's wait is extended while O(checkpoint_dir) changed within this many
        seconds.
    type: float
    default: 5
  checkpoint_stable_window:
    description:
      - With V(wait_for_checkpoint), a checkpoint completed during the stop lands at once where
        its layout marks the end of its save (the marker written last, a rename into place,
        DCP's C(.metadata), or the layout's pointer naming it). Where the layout marks none
        (SpecForge's scripts copy the model code after the weights; a C(custom) layout without
        a marker), it lands once a later save has begun or nothing in it has changed for this
        many seconds. A quiet directory never makes an incomplete checkpoint land.
    type: float
    default: 0.5
  graceful_wait_cap:
    description: Hard cap, in seconds, on the graceful stage's wait including extensions.
    type: float
    default: 900
    aliases: [checkpoint_max_wait]
  require_checkpoint:
    description: Fail when no sound new checkpoint appeared, even when no signal could make one.
    type: bool
    default: false
  on_missing_checkpoint:
    description:
      - When the trainer catches a ladder signal (a graceful stop was possible) but no sound new
        checkpoint appeared in O(checkpoint_dir) - V(fail) fails the task with the steps lost,
        the free space and the temporary files left; V(proceed) reports the same and succeeds.
    type: str
    choices: [fail, proceed]
    default: fail
  no_graceful:
    description:
      - What to do when no ladder signal can make the trainer checkpoint (it saves on none of them
        (O(saves_on)), or ignores the one it saves on, as SIGINT after a C(nohup ... &) launch).
      - V(wait_for_checkpoint) (the checkpoint-aligned stop) sends nothing until a checkpoint
        completed since the stop began has landed in O(checkpoint_dir) (a save already under way
        counts; see O(checkpoint_stable_window)), then runs the ladder from its first stage that
        can end the process within 0.2 s, skipping any stage whose signal the trainer ignores. It
        waits at most 1.5x the interval between the trainer's periodic checkpoints (counted from
        its start when it wrote one, else the directory's history) or O(next_checkpoint_timeout);
        while a save is under way (a checkpoint begun during the stop and not complete, however
        quiet, or a temporary entry written within O(checkpoint_activity_window)) it waits on, up
        to O(graceful_wait_cap). It fails without signalling when none lands, or when there is no
        such history and no save under way.
      - V(fail) fails before any signal, reporting what a stop would lose.
      - V(proceed) runs the ladder as configured.
    type: str
    choices: [wait_for_checkpoint, fail, proceed]
    default: wait_for_checkpoint
  next_checkpoint_timeout:
    description: Upper bound in seconds of the V(wait_for_checkpoint) wait.
    type: float
    default: 1800
    aliases: [checkpoint_wait_max]
  log_file:
    description: The trainer's log, to read the last step it logged (for the loss report).
    type: path
  step_regex:
    description: Regex whose first group is the step number in a log line.
    type: str
    default: \bstep (\d+)\b
  py_spy:
    description: >-
      Path of py-spy; when unset it is looked for in C(/usr/local/bin), C(/usr/bin), C(/bin) and
      C(/root/.local/bin) (C(pct exec) runs commands with PATH=/sbin:/bin:/usr/sbin:/usr/bin).
    type: path
  py_spy_timeout:
    description: Seconds a C(py-spy dump) may take.
    type: float
    default: 10
  signal_at:
    description:
      - Send the first signal at this moment (seconds since the epoch, by the node's clock), not
        at once - after the checks, and after a save being written when the stop waits for one.
        The CTs of a gang are given one moment, so their ranks are signalled together and enter
        their save together. A moment already past sends the signal at once (RV(signal_late_s)
        says by how much).
    type: float
  request_path:
    description:
      - The stop request's file, when the running trainer's environment does not name one in
        C(DFLASH_STOP_REQUEST) (that one wins - it is the file the trainer watches).
      - 'The request is stage 0, before any signal - one JSON object C({"id", "requested_at",
        "deadline"}) renamed into place (at O(signal_at) in a gang). The trainer logs
        C(dflash-stop-request: acknowledged id=ID step=N) at its next step boundary, saves, logs
        C(dflash-stop-request: saved id=ID step=N checkpoint=PATH), and exits 0. No
        acknowledgement within O(request_ack_timeout) - the request is withdrawn and the signal
        ladder follows; the exit is awaited up to O(graceful_wait_cap).'
    type: path
  request_ack_timeout:
    description: Seconds the stop waits for the acknowledgement of its request.
    type: float
    default: 30
  detach:
    description:
      - Run the stop in a detached process inside the target (own session, stdio on /dev/null)
        and wait for it there, so a dropped controller connection cannot interrupt a stop half
        way. The module returns the moment the detached stop ends, with no polling interval.
      - A later call that finds a detached stop still running waits for it and returns its
        result (C(adopted=true)) instead of starting another.
      - Not used in check mode.
    type: bool
    default: false
  detach_dir:
    description:
      - Root-only directory (a real directory, not a symlink) where the detached stop leaves
        C(stop.worker) and C(stop.result.json).
    type: path
    default: /run/dflash
  progress_file:
    description:
      - While it waits, the stop writes its progress here about once a second (the stage and its
        signal, the seconds waited against the bound, the processes still running, the checkpoint
        bytes written since the stop began, the steps not yet in a checkpoint), and removes it when
        it ends. Its action plugin sets it (in O(detach_dir)) and shows it on the controller once a
        wait passes 10 seconds, every 5 seconds, in C(ansible-playbook) and AWX output alike.
      - Must be in a root-only directory (written with O_NOFOLLOW and renamed into place).
    type: path
  lifecycle_dir:
    description:
      - The CT's lifecycle directory (O(dflash.lifecycle.trainer_process#module:lifecycle.dir)). A
        stop that ends as asked records there that the run is wanted stopped, so the CT's Proxmox
        hook does not relaunch it when the CT starts again. Unset, nothing is recorded.
    type: path
  cause:
    description:
      - What the CT's history counts this stop's steps lost, and the GPUs' idle until the next run's first
        progress line, under (C(dflash_steps_lost_total), C(dflash_gpu_idle_seconds_total)) - V(stop), a
        job's stop (C(make stop), a rollback's), or V(redeploy), a redeploy's.
    type: str
    choices: [stop, redeploy]
    default: stop
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
    details: With O(detach) the stop already outlives a dropped connection, without polling.
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Reports the targets, the other GPU holders, the signal dispositions and the ladder; sends nothing.
  diff_mode:
    support: full
    details: The process set before and after.
  platform:
    support: full
    platforms: posix
notes:
  - Runs on the target (inside the container with P(dflash.lifecycle.pct#connection)); needs Linux
    /proc and Python 3.8 or later; pidfds need Linux 5.3 and Python 3.9.
seealso:
  - name: systemd.kill(5)
    description: KillMode, and the SIGTERM then SIGKILL sequence this ladder generalises.
    link: https://www.freedesktop.org/software/systemd/man/latest/systemd.kill.html
"""

EXAMPLES = r"""
- name: Stop the trainer, checkpoint first
  dflash.lifecycle.staged_stop:
    pidfile: /run/dflash/trainer.pid
    pattern: train_dflash_pipeline[.]py
    checkpoint_dir: /workspace/checkpoints
    checkpoint_format: auto  # the layout is recognised and named in the result
    saves_on: SIGINT  # its KeyboardInterrupt handler writes a checkpoint
    require_checkpoint: true
    detach: true  # the stop runs to its end even if the connection drops
  register: trainer_stopped

- name: An HF Trainer run (saves on no signal) - stop right after its next checkpoint-N is complete
  dflash.lifecycle.staged_stop:
    pattern: run_clm[.]py
    checkpoint_dir: /workspace/out
    checkpoint_format: hf_trainer
    no_graceful: wait_for_checkpoint

- name: A trainer known to ignore SIGINT; give SIGTERM longer
  dflash.lifecycle.staged_stop:
    pattern: train_dflash_pipeline[.]py
    ladder:
      - {signal: SIGINT, scope: main, wait: 90}
      - {signal: SIGTERM, scope: tree, wait: 60}
      - {signal: SIGKILL, scope: tree, wait: 10}
"""

RETURN = r"""
lock:
  description: >-
    The redeploy lock this task ran under (holder, since and expires as epoch seconds,
    taken_over_from, msg, released), also when it failed after taking it.
  returned: when O(lock_holder) is set
  type: dict
adopted:
  description: With O(detach), whether this call found an earlier detached stop running and waited for it.
  returned: when O(detach) is true and not in check mode
  type: bool
msg:
  description: One line for a human (AWX job output).
  returned: always
  type: str
  sample: stopped PID 163 at stage 1 (SIGINT) in 2.4s; new checkpoint /workspace/checkpoints/step_812
stopped:
  description: Whether no process of the target set runs any more (false in check mode).
  returned: always
  type: bool
stopped_by:
  description:
    - The stage that ended the last process, or null when nothing ran.
    - Stage -1, no signal and scope C(request) when the run ended on the stop request.
  returned: always
  type: dict
  sample: {stage: 0, signal: SIGINT, scope: main}
request:
  description:
    - The stop request - C(path) and where it was read (C(path_from)), whether the run
      C(announced) it honours requests, the C(body) written, its C(acknowledged) id and step, the
      checkpoint the trainer C(saved), C(taken) (null in check mode), C(exit_after_s) from the
      request to the run's end, and C(why) when it was not taken.
  returned: when O(saves_on) is V(request), or V(auto) and the run announced it honours requests
  type: dict
  sample: {path: /run/dflash/stop-request, taken: true, acknowledged: {id: 3f2a9c1e0b7d, step: 1234}, exit_after_s: 4.2}
signalled_at:
  description: When the first signal was sent (seconds since the epoch, the node's clock); the skew of a gang's stop is the spread of its CTs' moments.
  returned: when a signal was sent
  type: float
signal_late_s:
  description: How long after O(signal_at) the first signal went (0 when on time).
  returned: when O(signal_at) was set and a signal was sent
  type: float
signal_spare_s:
  description:
    - How long before O(signal_at) the stop was ready to send its first signal, its checks done
      and any save being written waited out; negative when it was ready only after the moment.
    - A gang's report judges the margin before its moment by the smallest over its CTs.
  returned: when O(signal_at) was set and a signal was sent
  type: float
timeline:
  description:
    - Events in order. C(t) is the monotonic clock, C(elapsed) seconds since the module started,
      C(at) the wall clock (seconds since the epoch, to compare with file times).
    - Events are C(signal) (with the PIDs it reached), C(skipped), C(waited_for_save) (the first
      signal held while a save was written), C(checkpoint_landed), C(wait_extended), C(held) and
      C(released) (a launcher's agent held while its workers saved), C(elastic_restart), the stop
      request's C(request), C(request_acknowledged), C(request_saved), C(request_not_taken),
      C(request_failed) and C(request_outlived), and C(stopped) (stage -1 - by the request).
  returned: always
  type: list
  elements: dict
  sample: [{event: signal, stage: 0, signal: SIGINT, scope: main, pids: [163], t: 8512.1, elapsed: 0.02}]
targets:
  description: The target set with roles (main, descendant, run identity, wrapper, leftover).
  returned: always
  type: list
  elements: dict
run_id:
  description: The run identity (C(DFLASH_RUN_ID)) of the trainer, null for one started without it.
  returned: always
  type: str
other_gpu_holders:
  description: >-
    Processes holding a O(device_glob) device that are not of the run - never signalled. Each has
    pid, ppid, cmdline, devices and why it is not a target.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 412, ppid: 0, cmdline: nvidia-smi -l 1, devices: [/dev/nvidia5],
            why: "attached from outside the CT (PPID 0: a pct exec session)"}]
cpu_s:
  description: CPU seconds the stop itself used (user and system).
  returned: always
  type: float
survivors:
  description: Processes of the set still running after the last stage, with per-thread state.
  returned: always
  type: list
  elements: dict
diagnostics:
  description: Threads (state, wchan) and py-spy output of the main process before escalation.
  returned: when a stage past the first was reached
  type: dict
checkpoint:
  description:
    - What the checkpoint directory holds after the stop, judged by its layout - C(format) and
      C(format_reason) (the layout used, and for V(auto) what it was recognised by), C(newest)
      (the newest complete checkpoint, by step) with C(newest_step) and C(newest_age_s), C(appeared)
      (every checkpoint new or changed since the stop began, each with C(step), C(complete) and the
      C(problems) that make it incomplete), C(new) (the newest checkpoint that became complete
      during the stop, by its layout's rule and files, whether it existed before or not - a save
      under way when the stop began counts) with C(new_step), C(new_completed_at) (its last
      write, wall clock), C(new_by) and C(new_by_signal) (what produced it - the last signal sent
      before it completed, or the trainer's own save the stop waited for, with the signal after
      which the trainer wrote it again, if it did), C(written) (C(new) is
      what the resume loads) and C(doubts) (why not - its layout's pointer names another entry),
      C(unfinished) (later saves left incomplete - reported, never a doubt on C(new)), C(resume)
      (what the trainer's own resume rule loads - C(name), C(path), C(step), C(complete),
      C(problems), C(rule)) and C(temp_files_left) with their size. The message says the same
      verdict.
  returned: when checkpoint_dir is given
  type: dict
  sample: {dir: /workspace/checkpoints, format: hf_trainer, format_reason: "auto: 3 entries like checkpoint-500",
           newest: /workspace/checkpoints/checkpoint-500, newest_step: 500, newest_age_s: 0.4,
           appeared: [{name: checkpoint-500, path: /workspace/checkpoints/checkpoint-500, step: 500, complete: true, problems: []}],
           new: /workspace/checkpoints/checkpoint-500, new_step: 500, new_completed_at: 1796170000.4,
           new_by: "the trainer's own save, which the stop waited for", new_by_signal: null,
           written: true, doubts: [], unfinished: [],
           resume: {name: checkpoint-500, path: /workspace/checkpoints/checkpoint-500, step: 500, complete: true,
                    problems: [], rule: "the highest checkpoint-N, unchecked (get_last_checkpoint)"},
           temp_files_left: []}
launcher:
  description:
    - For a run a launcher started - C(launcher) (torchrun, accelerate, deepspeed), C(agent) (its PID),
      C(holders) (the processes held while the workers save), C(workers) (one per rank), C(deadline_s)
      and C(deadline) (the agent's wait before SIGKILL, and where it was read), C(max_restarts),
      C(restart_count), C(plan) (whom the graceful signal went to, V(agent) or V(workers), and why),
      C(ranks) (each rank's PID and the signal it ended by) and C(restarted) (workers an elastic
      restart started during the stop).
  returned: when the trainer is a launcher's agent
  type: dict
  sample: {launcher: torchrun, agent: 880, holders: [880], workers: [901, 902], deadline_s: 30,
           deadline: "30 s (torch 2.13.0+cpu's default)", max_restarts: 0, restart_count: 0,
           plan: {stage: 0, to: workers, why: "SIGINT to every worker's group at once, the agent held: its deadline
           (30 s (torch 2.13.0+cpu's default)) is shorter than the graceful cap 900 s"},
           ranks: [{pid: 901, rank: 0, ended_by: SIGINT (workers)}, {pid: 902, rank: 1, ended_by: SIGINT (workers)}]}
saves_on:
  description: >-
    The signals the trainer saves on (C(signals)) and those a save in progress survives
    (C(save_survives)), null when not known, and where that came from (C(words)).
  returned: when a trainer was found
  type: dict
  sample: {signals: [], save_survives: [], words: "saves_on=auto: a HF transformers Trainer trainer saves nothing on a signal"}
signal_dispositions:
  description: For each ladder signal, whether the main process catches, ignores or defaults it.
  returned: when a trainer was found
  type: dict
  sample: {SIGINT: caught, SIGTERM: default, SIGKILL: default}
checkpoint_dir_source:
  description: Where the checkpoint directory came from - the trainer's own flag, or O(checkpoint_dir).
  returned: when a trainer was found
  type: str
  sample: the trainer's --output-dir
found:
  description: >-
    How the trainer was found (pidfile or pattern) and why a pidfile was rejected; C(leftovers) lists
    the processes (pid, cmdline) that carry the run id of the pidfile's dead trainer: its DataLoader
    workers or a launcher's other ranks, which no pattern match takes for a trainer.
  returned: always
  type: dict
leftovers:
  description: >-
    When no trainer ran but its dead run's leftovers did: the PIDs ended (SIGTERM, 3 s, then SIGKILL),
    those that needed SIGKILL, and any that survived (the stop then fails).
  returned: when a dead run's leftovers were ended
  type: dict
  contains:
    ended: {description: PIDs signalled., type: list, elements: int, returned: always}
    killed: {description: PIDs that needed SIGKILL., type: list, elements: int, returned: always}
    survivors: {description: PIDs still running after SIGKILL., type: list, elements: int, returned: always}
notes:
  description: >-
    Plain-words notes (also shown as warnings): on the signal dispositions only when signals were
    sent (a stop the request ended sent none: the dispositions are then the fallback's facts, in
    C(signal_dispositions) and C(graceful_reason)), on a request made unannounced, on a save on an
    unexpected signal.
  returned: always
  type: list
  elements: str
  sample: ["SIGINT is ignored by PID 8 (SigIgn): its handler cannot run, so it cannot checkpoint on this signal"]
graceful_possible:
  description: Whether a ladder signal reaches a handler of the main process before one ends it.
  returned: when a trainer was found
  type: bool
graceful_stage:
  description: Index in the ladder of the stage whose signal the trainer catches, or null.
  returned: when a trainer was found
  type: int
graceful_reason:
  description: The same in plain words, with the other signals' dispositions.
  returned: when a trainer was found
  type: str
  sample: "SIGINT is ignored by PID 8, as after a background launch (nohup/&); SIGTERM is not caught by PID 8: it ends it without a checkpoint"
loss_at_start:
  description:
    - What a stop would have lost before anything was sent - newest complete checkpoint (path,
      its step by its layout, age), last step in the log, the steps in between (C(steps_lost); null
      with C(ahead_of_log) when the checkpoint's step is past the log's last one), and the interval
      between the trainer's periodic checkpoints.
  returned: when a trainer was found
  type: dict
loss:
  description:
    - The same figures after the stop (steps_lost is what the stop lost).
    - C(steps_lost) is counted from the log's last progress line; C(log_every) is how many steps
      apart its lines are, and C(steps_lost_up_to) adds the steps a trainer that logs every N
      steps may have made after its last line (up to N-1), lost too. Both say the same where the
      trainer logs every step, and are 0 when it saved on the stop.
    - C(saved_on_stop) is true when the newest complete checkpoint was written after the signal the
      trainer saves on, and the trainer then exited; it holds every step the trainer made, so
      steps_lost is 0 even when the log's last progress line is older (a trainer that logs every
      N steps stops between two of them).
  returned: when the ladder ran
  type: dict
ladder:
  description: The ladder as run.
  returned: always
  type: list
  elements: dict
"""

from ansible_collections.dflash.lifecycle.plugins.module_utils import leased
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import staged_stop
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.stop_options import (
    ARGUMENT_SPEC, InvalidParameter, StopOptions)


def main():
    module = leased.LeasedModule(argument_spec=ARGUMENT_SPEC, phase="stop", required_one_of=[("pidfile", "pattern")],
                                 supports_check_mode=True)
    try:
        options = StopOptions(module.params)
    except InvalidParameter as err:
        module.fail_json(msg=str(err))
    result = staged_stop.run_in_module(options, check_mode=module.check_mode, lease=module.worker_lease())
    if result.pop("failed", False):
        module.fail_json(**result)
    for note in result["notes"]:
        module.warn(note)
    if module._diff:
        before = "".join(f"{p['pid']} {p['cmdline']}\n" for p in result["targets"])
        after = before if module.check_mode else "".join(
            f"{p['pid']} {p['cmdline']}\n" for p in result["survivors"])
        result["diff"] = {"before": before, "after": after,
                          "before_header": "processes", "after_header": "processes"}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
