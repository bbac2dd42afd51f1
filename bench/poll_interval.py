"""The controller's CPU while a task waits in a CT, by ansible.cfg's internal_poll_interval.

While a task runs, ansible-playbook's main process checks its workers' results in a loop and sleeps
internal_poll_interval between checks (ansible-core's StrategyBase._wait_on_pending_results): the
whole of a stop that waits for a checkpoint, a launch's health wait, the wait for a gang's moment.
Each check costs tens of microseconds of Python, so the loop's CPU is in proportion to its rate,
and the interval is also the most a task's end can wait to be seen.

In alternation, RUNS times each, for each interval: a local play whose one task sleeps WAIT
seconds, the same play with a task that sleeps 0 s, and a play of TASKS tasks that end at once
(where only the latency shows). Prints the median CPU of ansible-playbook and its workers, what a
second of waiting costs (the two sleeps' difference, % of one core), and the wall of the
TASKS-task play. Needs no testbed.

    .venv/bin/python bench/poll_interval.py [--runs N] [--wait S] [--intervals 0.001,0.005,0.02]
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK_BIN = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
PLAY = """\
- name: Poll interval
  hosts: localhost
  gather_facts: false
  tasks:
{tasks}"""
WAIT_TASK = """\
    - name: Wait as a stop waits for its checkpoint
      ansible.builtin.command: sleep {wait}
      changed_when: false
"""
QUICK_TASK = """\
    - name: Quick {n}
      ansible.builtin.set_fact:
        value_{n}: {n}
"""


def config(directory, interval):
    """ansible.cfg with this interval and nothing else of the project's (no inventory, no callbacks)."""
    path = os.path.join(directory, f"ansible-{interval}.cfg")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"[defaults]\ninternal_poll_interval = {interval}\ninterpreter_python = {sys.executable}\n"
                     "localhost_warning = False\n")
    return path


def run(playbook, cfg):
    """(CPU seconds of ansible-playbook and its workers, wall seconds) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run([PLAYBOOK_BIN, "-i", "localhost,", "-c", "local", playbook], check=True,
                   env={**os.environ, "ANSIBLE_CONFIG": cfg}, stdout=subprocess.DEVNULL, cwd=REPO)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--wait", type=float, default=20.0)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--intervals", default="0.001,0.005,0.02")
    args = parser.parse_args()
    intervals = args.intervals.split(",")
    with tempfile.TemporaryDirectory() as work:
        plays = {"wait": os.path.join(work, "wait.yml"), "nowait": os.path.join(work, "nowait.yml"),
                 "quick": os.path.join(work, "quick.yml")}
        for name, wait in (("wait", args.wait), ("nowait", 0)):
            with open(plays[name], "w", encoding="utf-8") as handle:
                handle.write(PLAY.format(tasks=WAIT_TASK.format(wait=wait)))
        with open(plays["quick"], "w", encoding="utf-8") as handle:
            handle.write(PLAY.format(tasks="".join(QUICK_TASK.format(n=n) for n in range(args.tasks))))
        configs = {interval: config(work, interval) for interval in intervals}
        measured = {interval: {name: [] for name in plays} for interval in intervals}
        for _ in range(args.runs):
            for interval in intervals:
                for name, playbook in plays.items():
                    measured[interval][name].append(run(playbook, configs[interval]))
    print(f"internal_poll_interval: a task that waits {args.wait:.0f} s, and {args.tasks} tasks that end at once "
          f"(median of {args.runs} alternating runs each)")
    print(f"| interval | CPU s, the {args.wait:.0f} s task | CPU s, the 0 s task | waiting's CPU, % of a core "
          f"| wall s, {args.tasks} quick tasks |")
    print("|---|---|---|---|---|")
    for interval in intervals:
        cpu = {name: statistics.median(c for c, _wall in runs) for name, runs in measured[interval].items()}
        quick_wall = statistics.median(wall for _cpu, wall in measured[interval]["quick"])
        share = max(0.0, cpu["wait"] - cpu["nowait"]) / args.wait * 100
        print(f"| {interval} | {cpu['wait']:.2f} | {cpu['nowait']:.2f} | {share:.2f} | {quick_wall:.2f} |")


if __name__ == "__main__":
    main()
