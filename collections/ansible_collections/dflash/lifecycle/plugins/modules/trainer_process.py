#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: trainer_process
short_description: Start the trainer in its own session and wait until it is healthy
version_added: 0.1.0
author: dflash-lifecycle contributors
description:
  - Runs inside the CT. Refuses to start when a trainer already runs (O(pidfile) alive, or a
    process matching O(pattern)) or when a process holds one of O(device_paths) (the GPUs the run
    needs).
  - Starts O(command) with setsid, SIGINT/SIGTERM/SIGHUP/SIGQUIT at their default dispositions
    and an empty signal mask (so the staged stop's SIGINT reaches the trainer's KeyboardInterrupt
    handler), stdin from /dev/null, stdout and stderr appended to O(log_file) after rotating the
    old ones. The command is expected to exec the trainer, so the pidfile (C(PID STARTTIME),
    written with O_NOFOLLOW in a root-only directory) names the Python process itself.
  - Healthy means alive for O(health_seconds) and a log line matching O(health_regex). A trainer
    that dies fails the task with the tail of its log.
options:
  command:
    description: The argv to run, typically C([/bin/sh, <wrapper script>]).
    type: list
    elements: str
    required: true
  cwd:
    description: Working directory.
    type: path
    default: /
  pidfile:
    description: Where to write C(PID STARTTIME).
    type: path
    required: true
  pattern:
    description: Regex on the full command line of an already running trainer.
    type: str
  refuse_busy:
    description:
      - Refuse when a trainer runs or a GPU is held. A check run of a redeploy turns this off, as
        its stop phase would have stopped the trainer first.
    type: bool
    default: true
  device_paths:
    description: Device files of the GPUs the run uses; a holder means the GPUs are busy.
    type: list
    elements: str
    default: []
  log_file:
    description: Log of the run.
    type: path
    required: true
  log_keep:
    description: Old logs kept (C(log.1) ... C(log.N)).
    type: int
    default: 5
  health_seconds:
    description: How long the trainer must live before it counts as healthy.
    type: float
    default: 5
  health_regex:
    description: A log line proving progress.
    type: str
    default: tok/s
  health_timeout:
    description: Seconds to wait for health.
    type: float
    default: 300
attributes:
  check_mode:
    support: full
    details: Runs the refusal checks and reports what it would start; starts nothing.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Start the trainer
  dflash.lifecycle.trainer_process:
    command: [/bin/sh, /run/dflash/trainer.sh]
    pidfile: /run/dflash/trainer.pid
    pattern: train_dflash_pipeline[.]py
    device_paths: [/dev/nvidia0, /dev/nvidia1]
    log_file: /workspace/logs/train.log
"""

RETURN = r"""
pid:
  description: PID of the trainer (the Python process).
  returned: success
  type: int
progress_line:
  description: The first log line that matched O(health_regex).
  returned: success
  type: str
tokens_per_s:
  description: The first throughput figure (tok/s) of the run.
  returned: success
  type: float
log_tail:
  description: Last lines of the log when the trainer died.
  returned: failure
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.lifecycle.plugins.module_utils import launch


def main():
    module = AnsibleModule(
        argument_spec={
            "command": {"type": "list", "elements": "str", "required": True},
            "cwd": {"type": "path", "default": "/"},
            "pidfile": {"type": "path", "required": True},
            "pattern": {"type": "str"},
            "refuse_busy": {"type": "bool", "default": True},
            "device_paths": {"type": "list", "elements": "str", "default": []},
            "log_file": {"type": "path", "required": True},
            "log_keep": {"type": "int", "default": 5},
            "health_seconds": {"type": "float", "default": 5},
            "health_regex": {"type": "str", "default": "tok/s"},
            "health_timeout": {"type": "float", "default": 300},
        },
        supports_check_mode=True,
    )
    params = module.params
    running = launch.running_trainer(params["pidfile"], params["pattern"]) if params["refuse_busy"] else None
    if running is not None:
        module.fail_json(msg=f"a trainer is already running: PID {running.pid} "
                             f"({running.cmdline[:200]}); stop it first", pid=running.pid)
    busy = launch.gpu_holders(params["device_paths"]) if params["refuse_busy"] else {}
    if busy:
        module.fail_json(msg="GPUs in use: " + "; ".join(
            f"{dev} held by " + ", ".join(f"PID {h['pid']} ({h['cmdline'][:80]})" for h in holders)
            for dev, holders in sorted(busy.items())), busy=busy)
    if module.check_mode:
        module.exit_json(changed=True, msg=f"would start {' '.join(params['command'])}")
    try:
        result = launch.start(params)
    except launch.LaunchError as err:
        module.fail_json(msg=str(err), **err.details)
    module.exit_json(changed=True, msg=f"trainer PID {result['pid']} healthy", **result)


if __name__ == "__main__":
    main()
