#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: staged_stop
short_description: Stop a training process tree in stages, checkpoint first, and prove it stopped
version_added: 0.1.0
author: dflash-lifecycle contributors
description:
  - Finds the trainer (O(pidfile) first, else O(pattern) on the full command line), captures the
    whole target set before the first signal (the process, its descendants found by walking
    C(/proc) by PPid, its real process group and session when they are visible, optionally its
    wrapper, and orphans holding O(device_glob)), then climbs a O(ladder) of stages.
  - The default ladder is SIGINT to the main process (its KeyboardInterrupt handler writes a
    checkpoint) with a long wait, then SIGTERM to the tree, then SIGKILL to the tree. SIGCONT
    follows every signal but SIGKILL, so stopped processes can act on it.
  - Signals go to single processes identified by (PID, start time), through pidfds where the
    kernel allows; never to a process group number. Inside a container entered with
    C(pct exec) the PGID and SID are 0, and C(kill 0) would hit the caller itself.
  - Before relying on the first stage it reads SigIgn/SigCgt of the main process and says when
    the signal is ignored (a background launch by a non-interactive shell ignores SIGINT) or not
    caught; an ignored signal's stage is skipped unless O(skip_ignored_stage=false).
  - Waits without busy polling (poll() on pidfds). Stopped means every process of the set is gone;
    zombies count as gone. The first stage's wait is extended while O(checkpoint_dir) keeps
    changing, up to O(checkpoint_max_wait).
  - Before escalating past the first stage it records per-thread state and wchan of the main
    process and a C(py-spy dump) when py-spy exists (skipped for a thread in D state).
  - Processes that survive the last stage make the task fail with a report of them.
  - The module's own process and its ancestors are never targets (nor, with O(detach), the
    detached process and the module's ancestors).
options:
  pidfile:
    description:
      - Pidfile of the trainer, C(PID) or C(PID STARTTIME) (start time in clock ticks, field 22 of
        C(/proc/PID/stat)). A PID that now belongs to another process (start time differs, started
        after the pidfile was written, or does not match O(pattern)) is never signalled.
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
    description: Also stop the trainer's parent (for example C(bash run.sh)).
    type: bool
    default: false
  ladder:
    description:
      - Stages, in order. Scope V(main) signals the main process, V(group) its real process group
        (the tree when the PGID is 0 or not visible), V(tree) the whole target set.
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
      - Reparented processes that started after the trainer and hold a file matching this glob
        (a GPU) are orphans of the trainer and are stopped with it. Empty to disable.
    type: str
    default: /dev/nvidia*
  checkpoint_dir:
    description: Directory where the trainer writes checkpoints.
    type: path
  checkpoint_pattern:
    description: Glob of checkpoint entries in O(checkpoint_dir).
    type: str
    default: "*"
  checkpoint_temp_patterns:
    description:
      - Globs of temporary names. Such entries are not checkpoints, and a checkpoint directory
        holding one is not complete.
    type: list
    elements: str
    default: [".tmp*", "*.tmp", "*.partial", "*.incomplete"]
  checkpoint_activity_window:
    description:
      - The first stage's wait is extended while O(checkpoint_dir) changed within this many
        seconds.
    type: float
    default: 5
  checkpoint_max_wait:
    description: Hard cap, in seconds, on the first stage's wait including extensions.
    type: float
    default: 900
  require_checkpoint:
    description: Fail when no new complete checkpoint appeared after the first signal.
    type: bool
    default: false
  no_graceful:
    description:
      - What to do when the first stage's signal cannot make the trainer checkpoint (ignored, as
        after a C(nohup ... &) launch, or not caught).
      - V(wait_for_checkpoint) sends nothing until the next periodic checkpoint lands complete in
        O(checkpoint_dir), then runs the ladder from its first stage that can end the process; it
        waits at most 1.5x the interval between the last periodic checkpoints (or
        O(checkpoint_wait_max)), and fails without signalling when none lands or there is no
        such history.
      - V(fail) fails before any signal, reporting what a stop would lose.
      - V(proceed) runs the ladder as configured.
    type: str
    choices: [wait_for_checkpoint, fail, proceed]
    default: wait_for_checkpoint
  checkpoint_wait_max:
    description: Upper bound in seconds of the V(wait_for_checkpoint) wait.
    type: float
    default: 1800
  log_file:
    description: The trainer's log, to read the last step it logged (for the loss report).
    type: path
  step_regex:
    description: Regex whose first group is the step number in a log line.
    type: str
    default: \bstep (\d+)\b
  py_spy:
    description: Path of py-spy; found on PATH when not given.
    type: path
  py_spy_timeout:
    description: Seconds a C(py-spy dump) may take.
    type: float
    default: 10
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
extends_documentation_fragment:
  - dflash.lifecycle.redeploy_lease
attributes:
  check_mode:
    support: full
    details: Reports the targets, their signal dispositions and the ladder; sends nothing.
  diff_mode:
    support: full
    details: The process set before and after.
  platform:
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
    checkpoint_pattern: step_*
    require_checkpoint: true
    detach: true  # the stop runs to its end even if the connection drops
  register: trainer_stopped

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
  description: The stage that ended the last process, or null when nothing ran.
  returned: always
  type: dict
  sample: {stage: 0, signal: SIGINT, scope: main}
timeline:
  description:
    - Events in order. C(t) is the monotonic clock, C(elapsed) seconds since the module started.
    - Events are C(signal) (with the PIDs it reached), C(skipped), C(wait_extended) and C(stopped).
  returned: always
  type: list
  elements: dict
  sample: [{event: signal, stage: 0, signal: SIGINT, scope: main, pids: [163], t: 8512.1, elapsed: 0.02}]
targets:
  description: The target set with roles (main, descendant, group, session, wrapper, orphan).
  returned: always
  type: list
  elements: dict
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
  description: >-
    Newest complete checkpoint and its age, the newest one written after the first signal
    (C(new), C(written)), and temporary files left in the directory.
  returned: when checkpoint_dir is given
  type: dict
  sample: {dir: /workspace/checkpoints, newest: /workspace/checkpoints/step_812, newest_age_s: 0.4,
           new: /workspace/checkpoints/step_812, written: true, temp_files_left: []}
signal_dispositions:
  description: For each ladder signal, whether the main process catches, ignores or defaults it.
  returned: when a trainer was found
  type: dict
  sample: {SIGINT: caught, SIGTERM: default, SIGKILL: default}
found:
  description: How the trainer was found (pidfile or pattern) and why a pidfile was rejected.
  returned: always
  type: dict
notes:
  description: Plain-words notes on the signal dispositions (also shown as warnings).
  returned: always
  type: list
  elements: str
  sample: ["SIGINT is ignored by PID 8 (SigIgn): its handler cannot run, so it cannot checkpoint on this signal"]
graceful_possible:
  description: Whether the first stage's signal is caught (and not ignored) by the main process.
  returned: when a trainer was found
  type: bool
graceful_reason:
  description: The same in plain words, with the other signals' dispositions.
  returned: when a trainer was found
  type: str
  sample: SIGINT is ignored by PID 8, as after a background launch (nohup/&), SIGTERM is not caught
loss_at_start:
  description:
    - What a stop would have lost before anything was sent - newest complete checkpoint (path,
      step parsed from its name, age), last step in the log, the steps in between, and the
      interval between the last periodic checkpoints.
  returned: when a trainer was found
  type: dict
loss:
  description: The same figures after the stop (steps_lost is what the stop lost).
  returned: when the ladder ran
  type: dict
ladder:
  description: The ladder as run.
  returned: always
  type: list
  elements: dict
"""

import os

from ansible_collections.dflash.lifecycle.plugins.module_utils import checkpoints, detached, leased, proctable, rundir, staged_stop


def main():
    module = leased.LeasedModule(
        argument_spec={
            "pidfile": {"type": "path"},
            "pattern": {"type": "str"},
            "pid": {"type": "int"},
            "select": {"type": "str", "choices": ["only", "oldest", "newest"], "default": "only"},
            "include_wrapper": {"type": "bool", "default": False},
            "ladder": {"type": "list", "elements": "dict",
                       "default": [dict(s) for s in staged_stop.DEFAULT_LADDER]},
            "skip_ignored_stage": {"type": "bool", "default": True},
            "device_glob": {"type": "str", "default": "/dev/nvidia*"},
            "checkpoint_dir": {"type": "path"},
            "checkpoint_pattern": {"type": "str", "default": "*"},
            "checkpoint_temp_patterns": {"type": "list", "elements": "str",
                                         "default": list(checkpoints.DEFAULT_TEMP_PATTERNS)},
            "checkpoint_activity_window": {"type": "float", "default": 5},
            "checkpoint_max_wait": {"type": "float", "default": 900},
            "require_checkpoint": {"type": "bool", "default": False},
            "no_graceful": {"type": "str", "default": "wait_for_checkpoint",
                            "choices": list(staged_stop.NO_GRACEFUL)},
            "checkpoint_wait_max": {"type": "float", "default": 1800},
            "log_file": {"type": "path"},
            "step_regex": {"type": "str", "default": r"\bstep (\d+)\b"},
            "py_spy": {"type": "path"},
            "py_spy_timeout": {"type": "float", "default": 10},
            "detach": {"type": "bool", "default": False},
            "detach_dir": {"type": "path", "default": "/run/dflash"},
        },
        required_one_of=[("pidfile", "pattern")],
        supports_check_mode=True,
    )
    params = dict(module.params)

    def stop():
        try:
            return staged_stop.run(params, check_mode=module.check_mode)
        except staged_stop.StopFailed as err:
            return dict(err.result, failed=True)

    try:
        if params["detach"] and not module.check_mode:
            staged_stop.validate_ladder(params["ladder"])  # a bad ladder fails before the fork
            # the detached process is no descendant of ours: keep our ancestors out of reach
            params["exclude_pids"] = proctable.ancestors(proctable.snapshot(), os.getpid())
            result, adopted = detached.run(stop, params["detach_dir"], "stop")
            result["adopted"] = adopted
        else:
            result = stop()
    except staged_stop.InvalidParameter as err:
        module.fail_json(msg=str(err))
    except (rundir.UnsafePath, OSError) as err:
        module.fail_json(msg=f"detach_dir: {err}")
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
