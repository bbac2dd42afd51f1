"""module_utils/stop/ladder.py: which stage can make the trainer checkpoint."""

import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.ct import proctable
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop import ladder, target_set
from ansible_collections.dflash.lifecycle.plugins.module_utils.stop.stop_options import DEFAULT_LADDER, validate_ladder

BIT = {s: 1 << (s - 1) for s in (signal.SIGINT, signal.SIGTERM)}


def main_with(fake, ign=0, cgt=0):
    fake.add(8, "python3", 1, sig_ign=ign, sig_cgt=cgt)
    return proctable.read_process(8, fake.path)


SIGINT_SAVES = ({signal.SIGINT}, "saves_on=SIGINT")
SAVES_NOTHING = (set(), "saves_on=auto: a HF transformers Trainer trainer saves nothing on a signal")


def assess(main, saving):
    return ladder.assess(main, validate_ladder(DEFAULT_LADDER), *saving)


def test_a_caught_signal_the_trainer_saves_on_is_the_graceful_stage(fake):
    _d, stage, reason = assess(main_with(fake, cgt=BIT[signal.SIGINT]), SIGINT_SAVES)
    assert stage == 0 and reason == "SIGINT is caught by PID 8 and the trainer saves on it (saves_on=SIGINT)"


def test_a_caught_sigint_alone_is_no_graceful_stage(fake):
    """Python's own KeyboardInterrupt handler shows as caught (SigCgt): HF Trainer's SIGINT ends
    it wherever it is, a save included."""
    _d, stage, reason = assess(main_with(fake, cgt=BIT[signal.SIGINT]), SAVES_NOTHING)
    assert stage is None
    assert reason.startswith("SIGINT is caught by PID 8, but no checkpoint is expected to follow it (saves_on=auto: a HF "
                             "transformers Trainer trainer saves nothing on a signal) (Python's own")
    assert "can checkpoint" not in reason


def test_sigint_ignored_and_sigterm_saving_makes_sigterm_graceful(fake):
    main = main_with(fake, ign=BIT[signal.SIGINT], cgt=BIT[signal.SIGTERM])
    dispositions, stage, reason = assess(main, ({signal.SIGTERM}, "saves_on=SIGTERM"))
    assert dispositions == {"SIGINT": "ignored", "SIGTERM": "caught", "SIGKILL": "default"}
    assert stage == 1
    assert reason.startswith("SIGINT is ignored by PID 8, as after a background launch")
    assert reason.endswith("SIGTERM is caught by PID 8 and the trainer saves on it (saves_on=SIGTERM)")


def test_a_trainer_saving_on_sigint_that_ignores_it_has_no_graceful_stage(fake):
    """The field's stop: `nohup bash run.sh &` left SIGINT ignored, so the handler never runs."""
    _d, stage, reason = assess(main_with(fake, ign=BIT[signal.SIGINT], cgt=BIT[signal.SIGTERM]), SIGINT_SAVES)
    assert stage is None and reason.startswith("SIGINT is ignored by PID 8")
    assert "SIGTERM is caught by PID 8, but no checkpoint is expected to follow it" in reason


def test_a_signal_it_saves_on_but_does_not_catch_is_no_graceful_stage(fake):
    _d, stage, reason = assess(main_with_default(fake), SIGINT_SAVES)
    assert stage is None
    assert reason.startswith("the trainer saves on SIGINT (saves_on=SIGINT), but PID 9 does not catch it")


def test_a_later_stage_that_saves_is_graceful_past_a_signal_that_would_end_it(fake):
    # SIGINT at its default would end the trainer: SIGTERM, which it saves on, is the graceful
    # stage, and the climb skips SIGINT (test_stop_run)
    _d, stage, _reason = assess(main_with_default(fake), ({signal.SIGTERM}, "saves_on=SIGTERM"))
    assert stage == 1


def test_not_knowing_what_the_trainer_does_is_no_graceful_stage(fake):
    _d, stage, reason = assess(main_with(fake, cgt=BIT[signal.SIGINT]),
                               (None, "saves_on=auto, and the checkpoint layout is not known yet"))
    assert stage is None and reason.startswith("what the trainer does on a signal is not known")


def main_with_default(fake):
    fake.add(9, "python3", 1, sig_cgt=BIT[signal.SIGTERM])
    return proctable.read_process(9, fake.path)


# an agent whose worker exits at once, then that waits as torchrun's does in its exit barrier: in
# a C++ call no handler interrupts (SIGTERM ignored here), or in Python (SIGTERM ends it)
AGENT = """
import signal, subprocess, sys, time
if sys.argv[1] == "ignores":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
print(worker.pid, flush=True)
worker.wait()
if sys.argv[1] == "with-child":
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
time.sleep(60)
"""


class _Launch:
    def __init__(self, agent, worker):
        self.workers, self.holders = [worker], [agent]


def _climb_after_request(tmp_path, monkeypatch, how):
    """A Climb at the wait after a taken request, over a real agent and its worker (what staged_stop
    builds, less what this wait does not read)."""
    monkeypatch.setattr(ladder, "AFTER_MAIN_GRACE", 0.5)
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    proc = subprocess.Popen([sys.executable, str(script), how], stdout=subprocess.PIPE, text=True)
    worker_pid = int(proc.stdout.readline())
    agent, worker = proctable.read_process(proc.pid), proctable.read_process(worker_pid)
    targets = target_set.Targets()
    assert targets.add(agent, "main") and targets.add(worker, "tree")
    climb = object.__new__(ladder.Climb)
    climb.launch, climb.targets, climb.started = _Launch(agent, worker), targets, time.monotonic()
    climb.result = {"request": {}, "timeline": []}
    climb.refresh = lambda: None
    return climb, proc


@pytest.mark.parametrize("how, signals", [("ignores", ["SIGTERM", "SIGKILL"]), ("ends", ["SIGTERM"])])
def test_an_agent_left_alone_after_its_workers_exited_is_ended_and_said(tmp_path, monkeypatch, how, signals):
    climb, proc = _climb_after_request(tmp_path, monkeypatch, how)
    try:
        left = climb._exit_after_request(30.0, lambda now, final: 0.0)
        assert not left and proc.wait(timeout=5) == -signal.Signals[signals[-1]]
        assert climb.result["request"]["agent_ended"]["signals"] == signals
        assert climb.result["request"]["agent_ended"]["pids"] == [proc.pid]
        assert [e["signal"] for e in climb.result["timeline"] if e["event"] == "agent_ended"] == signals
    finally:
        proc.kill()
        proc.wait()


def worker_pid(climb):
    return climb.launch.workers[0].pid


def test_an_agent_with_a_process_of_the_run_beside_it_is_not_signalled(tmp_path, monkeypatch):
    """Something of the run besides the agents still runs (a child forked after its workers): the
    wait goes on to the cap, nothing signalled."""
    climb, proc = _climb_after_request(tmp_path, monkeypatch, "with-child")
    try:
        deadline = time.monotonic() + 30
        while not (children := [p for p in proctable.snapshot().values() if p.ppid == proc.pid and p.pid != worker_pid(climb)]):
            assert time.monotonic() < deadline, "the agent started no child after its worker"
            time.sleep(0.05)
        child = children[0]  # started once the worker was gone
        assert climb.targets.add(child, "tree")
        left = climb._exit_after_request(1.5, lambda now, final: 0.0)
        assert left == {proctable.read_process(proc.pid).identity, child.identity}
        assert "agent_ended" not in climb.result["request"] and proc.poll() is None
    finally:
        for p in proctable.snapshot().values():
            if p.ppid == proc.pid:
                os.kill(p.pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
