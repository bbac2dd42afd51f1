"""The controller's CPU on the system Python against another build of the same version, side by side.

ansible-playbook is pure Python: its CPU per job follows the interpreter's build. Debian builds its
python3 with profile-guided optimisation and link-time optimisation and links libpython statically;
a plain source build (pyenv's default: no --enable-optimizations, --enable-shared) runs the same
code slower. The project's venv is made on the system Python (Makefile PYTHON) for that reason.

Two venvs with requirements.txt, one per Python, then in alternation, RUNS times each: the parse of
redeploy.yml with every role (`ansible-playbook --list-tasks`: the start of every job) and a local
playbook of templating tasks, each task in a worker process as in a job (the per-task cost). Prints
the median CPU (user + system of the process and its workers) of each on each Python and the ratio.
Needs no testbed.

    .venv/bin/python bench/controller_python.py [--runs N] [--other /root/.pyenv/versions/3.11.7/bin/python3]
"""

import argparse
import glob
import os
import resource
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM_PYTHON = "/usr/bin/python3"
# a job's task shape: a worker per task, each templating a few variables and a filter
TEMPLATING_PLAY = """\
- name: Templating in workers
  hosts: localhost
  gather_facts: false
  vars:
    settings: "{{ dict(range(40) | map('string') | zip(range(40))) }}"
  tasks:
"""
TEMPLATING_TASK = """\
    - name: Task {n}
      ansible.builtin.set_fact:
        value_{n}: "{{{{ settings | dict2items | selectattr('value', 'gt', {n}) | map(attribute='key') | list | length }}}}"
"""


def other_python():
    """A python3 of the system Python's version that is another build (pyenv's), or None."""
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    return found[-1] if found else None


def make_venv(python, path):
    subprocess.run([python, "-m", "venv", path], check=True)
    subprocess.run([os.path.join(path, "bin", "pip"), "install", "--quiet", "--disable-pip-version-check",
                    "-r", os.path.join(REPO, "requirements.txt")], check=True)


def cpu_of(args):
    """CPU seconds (user + system) of a command and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(args, check=True, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg")))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--other", default=other_python(), help="the other build (default: pyenv's of that version)")
    args = parser.parse_args()
    if not args.other:
        print("no other build of the system Python's version here (pyenv's): nothing to compare")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        play = os.path.join(tmp, "templating.yml")
        with open(play, "w", encoding="utf-8") as out:
            out.write(TEMPLATING_PLAY + "".join(TEMPLATING_TASK.format(n=n) for n in range(20)))
        venvs = {"system": os.path.join(tmp, "system"), "other": os.path.join(tmp, "other")}
        make_venv(SYSTEM_PYTHON, venvs["system"])
        make_venv(args.other, venvs["other"])
        jobs = {
            "parse redeploy.yml (--list-tasks)": ["-i", "inventory/testbed", "redeploy.yml", "--list-tasks"],
            "20 templating tasks, one worker each": ["-i", "localhost,", "-c", "local", play],
        }
        cpu = {(job, name): [] for job in jobs for name in venvs}
        for _ in range(args.runs):
            for job, job_args in jobs.items():
                for name, venv in venvs.items():
                    cpu[(job, name)].append(cpu_of([os.path.join(venv, "bin", "ansible-playbook"), *job_args]))
    print(f"system: {SYSTEM_PYTHON}; other: {args.other}; median CPU seconds of {args.runs} runs each")
    print(f"{'job':40} {'system':>8} {'other':>8} {'system/other':>13}")
    for job in jobs:
        system, other = (statistics.median(cpu[(job, name)]) for name in venvs)
        print(f"{job:40} {system:8.3f} {other:8.3f} {system / other:13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
