"""module_utils/stop/target_set.py: exactly the run's processes, on a fake /proc.

Every rule of "touch only the run" is a test here: the identity, the legacy tree and its
wrapper, the bystanders that must never be touched, the leftovers that must be.
"""

import resource
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import target_set
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.stop_options import StopOptions

RUN = {"DFLASH_RUN_ID": "run-1", "PATH": "/usr/bin"}
PYTHON = "/usr/bin/python3.11"
TRAINER = "python3 -u /root/train_dflash_pipeline.py --output-dir /workspace/checkpoints"
GPU = ["/dev/nvidia0"]


def capture(fake, main_pid, **params):
    table = proctable.snapshot(fake.path)
    targets = target_set.Targets(fake.path)
    options = StopOptions(dict({"pattern": "x"}, **params))
    scope = target_set.capture(table[main_pid], table, options, targets, fake.path)
    holders = target_set.device_holders(options, table, fake.path)
    roles = {ident[0]: m["role"] for ident, m in targets.members.items()}
    return roles, target_set.others(holders, targets, table), scope


def test_a_launched_run_is_its_tree_and_every_carrier_of_its_identity(fake):
    fake.add(1, "tini", 0, 1, 1)
    fake.add(50, "python3", 1, 50, 50, start=100, cmdline=TRAINER, environ=RUN, exe=PYTHON, fds=GPU)
    fake.add(51, "python3", 50, 50, 50, start=101, cmdline="python3 -c spawn_main --multiprocessing-fork",
             environ=RUN, exe=PYTHON, fds=GPU)
    # a `setsid -f` helper of the run: own session, reparented to init, still the run's
    fake.add(60, "python3", 1, 60, 60, start=102, cmdline="python3 -c helper", environ=RUN,
             exe=PYTHON, fds=["/dev/nvidia1"])
    # an operator's nvidia-smi through `pct exec`: PPID 0, started later, holds a GPU
    fake.add(70, "nvidia-smi", 0, 0, 0, start=200, cmdline="nvidia-smi -l 1", fds=["/dev/nvidia5"])
    roles, others, scope = capture(fake, 50)
    assert scope.run_id == "run-1"
    assert roles == {50: "main", 51: "descendant", 60: "run identity"}
    assert [(o["pid"], o["devices"]) for o in others] == [(70, ["/dev/nvidia5"])]
    assert "PPID 0" in others[0]["why"]


def test_a_carrier_attached_from_outside_is_never_a_target(fake):
    fake.add(50, "python3", 1, 50, 50, start=100, cmdline=TRAINER, environ=RUN, exe=PYTHON)
    fake.add(70, "sh", 0, 0, 0, start=200, cmdline="sh -c probe", environ=RUN, fds=GPU)
    roles, others, _scope = capture(fake, 50)
    assert roles == {50: "main"} and [o["pid"] for o in others] == [70]


def test_legacy_trainer_with_its_wrapper_and_workers(fake):
    # the field: `nohup bash run.sh &` from `pct exec ... bash -lc`, reparented to init, PGID 0
    fake.add(1, "tini", 0, 1, 1)
    fake.add(40, "bash", 1, 0, 0, start=90, cmdline="/bin/bash /root/run.sh")
    fake.add(41, "python3", 40, 0, 0, start=91, cmdline=TRAINER, exe=PYTHON, fds=GPU)
    for worker in (42, 43):
        fake.add(worker, "python3", 41, 0, 0, start=92, cmdline=TRAINER, exe=PYTHON, fds=GPU)
    roles, _others, scope = capture(fake, 41, include_wrapper=True)
    assert scope.run_id is None
    assert roles == {41: "main", 40: "wrapper", 42: "descendant", 43: "descendant"}
    roles, _others, _scope = capture(fake, 41)  # include_wrapper off: the tree only
    assert 40 not in roles


def test_legacy_trainer_from_a_login_shell_takes_no_bystander(fake):
    # a real login (ssh, pct enter, tmux): the shell leads a session and a group that the
    # trainer, a sibling job (tensorboard) and the operator's editor share
    fake.add(1, "tini", 0, 1, 1)
    fake.add(30, "bash", 1, 30, 30, start=80, cmdline="-bash")
    fake.add(31, "python3", 30, 30, 30, start=81, cmdline=TRAINER, exe=PYTHON, fds=GPU)
    fake.add(32, "tensorboard", 30, 30, 30, start=82, cmdline="tensorboard --logdir /workspace")
    fake.add(33, "vim", 30, 30, 30, start=83, cmdline="vim train.py")
    # a GPU daemon started after the trainer, in a session of its own (setsid -f)
    fake.add(34, "python3", 1, 34, 34, start=84, cmdline="python3 eval_server.py", exe=PYTHON,
             fds=["/dev/nvidia2"])
    roles, others, _scope = capture(fake, 31, include_wrapper=True)
    assert roles == {31: "main"}
    assert [o["pid"] for o in others] == [34]


@pytest.mark.parametrize("argv", ["bash", "bash -i", "bash -l run.sh", "-bash", "bash --login"])
def test_an_interactive_or_login_shell_is_never_the_wrapper(fake, argv):
    fake.add(40, "bash", 1, 0, 0, start=90, cmdline=argv)
    fake.add(41, "python3", 40, 0, 0, start=91, cmdline=TRAINER, exe=PYTHON)
    roles, _others, _scope = capture(fake, 41, include_wrapper=True)
    assert roles == {41: "main"}


def test_a_wrapper_that_runs_more_than_the_trainer_is_not_taken(fake):
    fake.add(40, "bash", 1, 0, 0, start=90, cmdline="bash /root/run.sh")
    fake.add(41, "python3", 40, 0, 0, start=91, cmdline=TRAINER, exe=PYTHON)
    fake.add(42, "tensorboard", 40, 0, 0, start=92, cmdline="tensorboard --logdir x")
    roles, _others, _scope = capture(fake, 41, include_wrapper=True)
    assert roles == {41: "main"}


def test_leftovers_are_the_trainers_own_program_or_named(fake):
    fake.add(1, "tini", 0, 1, 1)
    fake.add(41, "python3", 1, 0, 0, start=91, cmdline=TRAINER, exe=PYTHON, fds=GPU)
    # a forked worker that outlived an earlier trainer of this run: reparented, same program
    fake.add(45, "python3", 1, 0, 0, start=95, cmdline=TRAINER, exe=PYTHON, fds=["/dev/nvidia3"])
    # a Jupyter kernel and a dcgm-exporter started later with setsid -f: not the run's
    fake.add(46, "python3", 1, 46, 46, start=96, cmdline="python3 -m ipykernel_launcher -f k.json",
             exe=PYTHON, fds=["/dev/nvidia4"])
    fake.add(47, "dcgm-exporter", 1, 47, 47, start=97, cmdline="dcgm-exporter",
             exe="/usr/bin/dcgm-exporter", fds=["/dev/nvidiactl"])
    # the same program but started before the trainer: an older run, not a leftover of this one
    fake.add(48, "python3", 1, 0, 0, start=50, cmdline=TRAINER, exe=PYTHON, fds=["/dev/nvidia6"])
    roles, others, _scope = capture(fake, 41)
    assert roles == {41: "main", 45: "leftover"}
    assert [o["pid"] for o in others] == [46, 47, 48]
    roles, _others, _scope = capture(fake, 41, leftover_pids=[47], leftover_pattern="ipykernel")
    assert roles == {41: "main", 45: "leftover", 46: "leftover", 47: "leftover"}


def test_a_main_process_gone_before_it_is_held_is_no_target(fake):
    fake.add(41, "python3", 1, start=91, cmdline=TRAINER)
    table = proctable.snapshot(fake.path)
    fake.remove(41)
    targets = target_set.Targets(fake.path)
    assert target_set.capture(table[41], table, StopOptions({"pattern": "x"}), targets, fake.path) is None
    assert targets.members == {}


def test_real_identity_check_never_signals_a_reused_pid():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = proctable.read_process(child.pid)
        targets = target_set.Targets(use_pidfd=False)
        assert targets.send((child.pid, me.starttime + 1), signal.SIGTERM) is False
        assert child.poll() is None
        assert targets.send(me.identity, signal.SIGTERM) is True
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("use_pidfd", [True, False])
def test_wait_gone_wakes_on_exit(use_pidfd):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    targets = target_set.Targets(use_pidfd=use_pidfd)
    try:
        assert targets.add(proctable.read_process(child.pid), "main")
        began = time.monotonic()
        assert targets.wait_gone(list(targets.members), timeout=20) == set()
        assert time.monotonic() - began < 15  # woke on the exit, not at the timeout
    finally:
        targets.close()
        child.wait()


def test_an_exited_target_does_not_make_the_wait_spin():
    """One target exits at once (its pidfd stays readable), the other runs on: the wait must
    sleep, not return from poll() at once in a loop."""
    quick = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    targets = target_set.Targets()
    try:
        for child in (quick, slow):
            assert targets.add(proctable.read_process(child.pid), "main")
        assert targets.use_pidfd
        quick.stdin.close()
        quick.wait()  # gone; the pidfd of the exited process stays readable
        ticks = []
        before = resource.getrusage(resource.RUSAGE_SELF)
        targets.wait_gone(list(targets.members), timeout=20, on_tick=lambda now, final: ticks.append(now) or 0.0)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert cpu < 0.5, f"the wait used {cpu:.2f} CPU-s in about 3 s"
        assert len(ticks) < 3 / target_set.WAIT_TICK_SECONDS + 5, len(ticks)
    finally:
        targets.close()
        slow.kill()
        slow.wait()
