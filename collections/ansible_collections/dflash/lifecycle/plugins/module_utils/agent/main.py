# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's entry (Python 3.8 compatible): the commands the CT's agent.zip runs - the Proxmox hook's
phases (agent/hook.py), ``supervise`` (agent/supervise.py) and ``metrics`` (agent/metrics.py) - and
the launch the modules run, the
transaction (agent/transaction.py) whose worker, once its result is delivered, becomes the run's
supervisor. It reaches every room of the agent, so a module that imports it carries the whole agent
in its payload: the agent.zip a launch writes (agent/payload.py) is that payload's. The launch is
imported by launch() alone: a supervisor that watches, or a pre-stop, compiles none of it.
"""

from __future__ import annotations

import os
import sys

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import hook, supervise


def launch(params, check_mode, warn, lease=None, unlock=False):
    """The launch of params (launch_options.ARGUMENT_SPEC's, validated): transaction.run, its worker
    becoming the run's supervisor once the result is delivered. Returns the task's result, or
    raises launch_options.LaunchFailed."""
    from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import transaction

    directory = (params.get("lifecycle") or {}).get("dir")
    try:
        return transaction.run(params, check_mode, warn, lease, unlock, after=supervise.taking_over(params))
    finally:
        if directory and not check_mode:  # the run's metrics, whatever became of the launch
            from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import metrics_process

            problem = metrics_process.ensure(directory)
            if problem:
                warn(problem)


def main(argv, agent=None):
    """``hook <phase>``: pve-container's phases (the others cost nothing), and ``resume``. agent:
    the agent's zip, in the run's lifecycle directory (sys.argv[0] when run as ``python agent.zip``)."""
    agent = os.path.abspath(agent or sys.argv[0])
    directory = os.path.dirname(agent)
    phase = argv[0] if argv else ""
    if phase == "pre-stop":
        return hook.pre_stop(directory, float(argv[1]) if len(argv) > 1 and argv[1] else None)
    if phase == "post-start":
        return hook.post_start(directory)
    if phase == "resume":
        return hook.resume(directory)
    if phase == "supervise":
        return supervise.supervise(directory, agent)
    if phase == "metrics":
        from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import metrics

        return metrics.serve(directory)
    if phase in ("pre-start", "post-stop"):
        return 0
    sys.stderr.write(f"usage: hook pre-stop [MOMENT]|post-start (pve-container's phases)|resume|supervise|metrics; "
                     f"got {phase!r}\n")
    return 2
