#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: trainer_info
short_description: What runs in a CT - the trainer, its release, throughput, checkpoint and lock
version_added: 0.2.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Runs inside the CT and changes nothing. Finds the trainer (O(pidfile) first, else
    O(pattern)), and reports whether it runs, its PID, uptime and run identity, the release
    C(current) points to with any drift (files changed in place, verified by checksum), the
    throughput of its recent progress lines and the figure recorded at its launch, the newest
    checkpoint and its age, and the per-CT lock (its holder and the phase it reached).
options:
  pidfile:
    description: Pidfile of the trainer (C(PID STARTTIME RUN_ID)).
    type: path
    required: true
  pattern:
    description: Regex on the command line of a trainer without a pidfile.
    type: str
  checkpoint_dir:
    description: Where the trainer writes checkpoints.
    type: path
    required: true
  log_file:
    description: The trainer's log.
    type: path
    required: true
  step_regex:
    description: Regex whose first group is the step number of a progress line.
    type: str
    default: \bstep[\s:=#]*(\d+)\b
  throughput_patterns:
    description: Regexes of the throughput figure (a group named C(value), an optional C(unit)), tried in order.
    type: list
    elements: str
    default:
      - \btok(?:en)?s?/s\s*[=:]?\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[KkMm](?![A-Za-z]))?
      - (?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[KkMm])?\s*tok(?:en)?s?/s\b
  throughput_lines:
    description: How many of the last progress lines make the median.
    type: int
    default: 5
  log_lines:
    description: Also return the last this many lines of O(log_file) (RV(log_lines), C(make logs)), at most 10000; 0 for none.
    type: int
    default: 0
  throughput_history:
    description:
      - Also return up to this many points C([step, tok/s, time, release, run]) spread over the run's log
        and the one before it (C(LOG.1), the run the last redeploy replaced) (C(throughput.history)),
        time from the line's leading timestamp (or null), release and run identity from the launch's line at
        the head of each log (or null); 0 for none.
    type: int
    default: 0
  release_base:
    description: Directory of the releases; unset, no release is read.
    type: path
  lock_path:
    description: The per-CT lock file.
    type: path
    default: /run/dflash/redeploy.lock
  change_record:
    description: >-
      The CT's record of the last change a job made to its run (who, when, the phase it reached, how
      it ended, whether its controller saw it end), on the CT's disk.
    type: path
    default: /var/lib/dflash/last-change.json
  lifecycle_dir:
    description: >-
      The CT's lifecycle directory (O(dflash.lifecycle.trainer_process#module:lifecycle.dir)): what its
      Proxmox hook would do with the run is read from there (RV(lifecycle)).
    type: path
  models:
    description:
      - The paths the trainer loads from shared memory, mapped to their persistent copies, as
        M(dflash.lifecycle.model_stage) takes them. Each is compared by file names, sizes and
        modification times.
    type: dict
    default: {}
extends_documentation_fragment:
  - dflash.lifecycle.checkpoint_format
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
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Status of the trainer
  dflash.lifecycle.trainer_info:
    pidfile: /run/dflash/trainer.pid
    pattern: train_dflash_pipeline[.]py
    checkpoint_dir: /workspace/checkpoints
    log_file: /workspace/logs/train.log
    release_base: /opt/dflash
  register: trainer
"""

RETURN = r"""
running:
  description: Whether a trainer runs.
  returned: always
  type: bool
pid:
  description: Its PID, or null.
  returned: always
  type: int
uptime_s:
  description: Seconds since it started.
  returned: always
  type: float
run_id:
  description: Its run identity (C(DFLASH_RUN_ID)); null for a trainer started without one.
  returned: always
  type: str
cmdline:
  description: Its command line.
  returned: always
  type: str
log_lines:
  description: The last O(log_lines) lines of O(log_file), whether a trainer runs or not.
  returned: when O(log_lines) is set
  type: list
  elements: str
log_tail:
  description: The last 20 lines of O(log_file), when no trainer runs (why the last one ended).
  returned: when no trainer runs
  type: list
  elements: str
traceback:
  description:
    - The first Python traceback in the trainer's log, when it holds one - of the run that ended, or
      of a running one (a launcher's agent outlives its failed workers while it tears down).
  returned: when the log holds one
  type: list
  elements: str
release:
  description: C(current), C(previous), C(drift) (release to the files C(modified), C(added), C(removed)) and C(launch_failures).
  returned: when release_base is set
  type: dict
throughput:
  description: >-
    The step and tok/s of the last progress line (C(step), C(last)), the median of the last
    O(throughput_lines) (C(median), C(lines)), the figure recorded at the last launch
    (C(at_launch), the new run's window its redeploy measured), and with O(throughput_history) the
    points C([step, tok/s, time, release, run]) (C(history)). A running trainer's are read from the
    log its progress goes to (of the regular files its run holds open for writing, the newest
    written whose tail has a step, else O(log_file) when written since the trainer started);
    C(log_words) says which when that is not simply O(log_file).
  returned: always
  type: dict
  sample: {step: 8120, last: 14210.5, median: 14188.0, lines: 5, at_launch: 14002.3}
checkpoint:
  description: >-
    The directory, its layout (C(format), C(format_reason)), the newest complete checkpoint, its
    step and age, and what the trainer's resume would load (C(resume), as
    M(dflash.lifecycle.staged_stop) reports it); C(resume_older) says so in words when that is a
    complete checkpoint older than the newest complete one (a pointer that was not moved), with
    the steps between them, else null.
  returned: always
  type: dict
lock:
  description: The live per-CT lock (holder, since, expires, renewed, phase, worker), or null.
  returned: always
  type: dict
last_change:
  description: >-
    The last change a job made to the run, as the CT's worker recorded it (O(change_record)):
    C(holder), C(what), C(started_at), C(phase), C(finished_at), C(failed), C(outcome), C(controller)
    (V(gone) when its controller did not see it end), C(unattended) and C(words), the record in one
    line; null when there is none.
  returned: always
  type: dict
  sample: {holder: "root@vm ansible-playbook pid 15973", what: redeploy, phase: launch, controller: gone,
           unattended: true, words: "the redeploy started at 2026-12-05 20:19:40 UTC by root@vm ansible-playbook
           pid 15973 finished without its controller at 2026-12-05 20:19:47 UTC: trainer PID 4242 healthy"}
lifecycle:
  description: >-
    What the CT's Proxmox hook would do with the run (O(lifecycle_dir)) - C(wanted) (V(running) since a
    launch, V(stopped) since a stop asked for), C(wanted_by), C(wanted_at), C(release), C(paused) (the
    last Proxmox stop - its checkpoint, steps lost) and C(words); null when the CT keeps no spec.
  returned: always
  type: dict
supervisor:
  description: >-
    The run's supervisor (O(lifecycle_dir), docs/supervise.md) in one line - its state (watching, backing
    off, relaunching, stood down, finished, DOWN, or GONE when its process is), the hang timeout it learned,
    the restarts since the launch and each end's cause, checkpoint and diagnostics; null when the CT keeps no
    state of one.
  returned: always
  type: str
  sample: "watching trainer PID 812 (supervisor PID 790), a hang after 300.0 s without progress; 1 restarts
    since the launch; ends: 2026-12-05 20:31:02 UTC crash: the trainer killed by SIGKILL, checkpoint
    /workspace/ckpt/step_2000 -> trainer PID 812 healthy, resumed from /workspace/ckpt/step_2000"
metrics:
  description: >-
    The run's metrics process (O(lifecycle_dir), docs/monitoring.md) in one line - where it serves and its
    PID, or NOT SERVED when its process is gone, and how often the supervisor started it again since the
    launch; null for a run that serves no metrics.
  returned: always
  type: str
  sample: "served on 0.0.0.0:9733 by PID 611; the supervisor started it again 1 time(s) since the launch"
found:
  description: How the trainer was found, and why a pidfile was rejected.
  returned: always
  type: dict
models:
  description: >-
    Per O(models) entry, whether the model in shared memory matches its persistent copy: C(target),
    C(source), C(state) (V(matches), V(missing), V(differs)), C(differences), C(bytes), C(words); or
    C(error) (and C(words)) for an entry that cannot be staged.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.lifecycle.plugins.module_utils import trainer_state
from ansible_collections.dflash.lifecycle.plugins.module_utils.checkpoint import checkpoint_formats
from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import model_stage, progress


def main():
    module = AnsibleModule(
        argument_spec={
            "pidfile": {"type": "path", "required": True},
            "pattern": {"type": "str"},
            "checkpoint_dir": {"type": "path", "required": True},
            **checkpoint_formats.ARGUMENT_SPEC,
            "log_file": {"type": "path", "required": True},
            "step_regex": {"type": "str", "default": progress.STEP_REGEX},
            "throughput_patterns": {"type": "list", "elements": "str",
                                    "default": list(progress.THROUGHPUT_PATTERNS)},
            "throughput_lines": {"type": "int", "default": 5},
            "throughput_history": {"type": "int", "default": 0},
            "log_lines": {"type": "int", "default": 0},
            "release_base": {"type": "path"},
            "lock_path": {"type": "path", "default": "/run/dflash/redeploy.lock"},
            "change_record": {"type": "path", "default": "/var/lib/dflash/last-change.json"},
            "lifecycle_dir": {"type": "path"},
            "models": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    try:
        state = trainer_state.read(module.params)
    except ValueError as err:  # a step regex without a group, a pattern without value, a bad layout
        module.fail_json(msg=str(err))
    if module.params["log_lines"] > 0:
        state["log_lines"] = progress.read_lines(module.params["log_file"])[-min(module.params["log_lines"], 10000):]
    state["models"] = []
    for target, source in sorted(module.params["models"].items()):
        try:
            found = model_stage.plan(target, str(source), 0)
        except model_stage.StageError as err:
            state["models"].append({"target": target, "source": source, "error": str(err), "words": str(err)})
            continue
        state["models"].append({key: found[key] for key in ("target", "source", "state", "differences", "bytes")})
        state["models"][-1]["words"] = model_stage.words(found)
    module.exit_json(changed=False, **state)


if __name__ == "__main__":
    main()
