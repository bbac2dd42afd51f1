"""The run's supervisor with a trainer as people run them, on the testbed's ct201: the example
trainer under the real torch of `make venv-torch` (trainer_run_python), each step's batch taken from
a real torch.utils.data.DataLoader with two worker processes, forked, as a DFlash trainer's are.

1. the main process SIGKILLed (the OOM killer): its DataLoader workers outlive it with its command
   line; they are ended at once as the dead run's leftovers, and the crash is one end, one back-off,
   one restart;
2. a `make restart` typed during that back-off runs: its stop finds the dead run, not a trainer;
3. the main thread blocked for ever in a C call no signal ends (a hung NCCL collective): declared
   hung, its diagnostics hold every process's Python stack with native frames (py-spy, pushed into
   the CT by the preflight), stopped as a hang (SIGINT's grace taken from the run's cadence, not the
   stop's 120 s), and relaunched from its newest complete checkpoint, the steps lost stated.
"""

import json
import re
import shlex
import time

import pytest

import testlib
from testlib import TORCH_PYTHON, wait_for

CT, NODE, VMID = "ct201", "pve1", 201
LIFECYCLE = "/var/lib/dflash/lifecycle"
FAULT = "/run/dflash-test-fault"
BACKOFF_S = 12  # long enough for a `make restart` to start within it (test 2)
SETTINGS = {
    "trainer_run_python": TORCH_PYTHON,
    "trainer_launch_health_seconds": 1,
    "trainer_launch_supervise_backoff_s": BACKOFF_S,
    "trainer_launch_supervise_backoff_max_s": BACKOFF_S,
    "trainer_launch_supervise_hang_floor_s": 2,
    "trainer_launch_supervise_hang_factor": 3,
    "dflash_profile_interval": 10,
    "dflash_extra_args": ["--save-interval", "40"],
    "dflash_env": {"PYTHONUNBUFFERED": "1", "DFLASH_TEST_FAULT_FILE": FAULT, "DFLASH_TEST_DATALOADER_WORKERS": "2"},
}


def sh(testbed, command, check=True):
    return testbed.in_ct(NODE, VMID, command, check=check, timeout=120)


def run_processes(testbed):
    """{pid: ppid} of every process with the trainer's command line (the main one and its workers)."""
    out = sh(testbed, "for p in $(pgrep -f 'train_dflash_pipeline[.]py'); do echo $p $(ps -o ppid= -p $p); done",
             check=False).stdout.split()
    return {int(pid): int(ppid) for pid, ppid in zip(out[::2], out[1::2])}


def trainer(testbed):
    """(main PID, its worker PIDs) of the run that trains now, once its two workers are there."""
    procs = run_processes(testbed)
    mains = [pid for pid, ppid in procs.items() if ppid not in procs]
    if len(mains) != 1:
        return None
    workers = [pid for pid, ppid in procs.items() if ppid == mains[0]]
    return (mains[0], workers) if len(workers) == 2 else None


def state(testbed):
    return json.loads(sh(testbed, f"cat {LIFECYCLE}/supervisor.json").stdout)


def supervisor_log(testbed):
    return sh(testbed, f"tail -n 20 {LIFECYCLE}/supervisor.log", check=False).stdout


def relaunched(testbed, old_pid, timeout=90):
    def watching():
        now, run = state(testbed), trainer(testbed)
        pid = (now.get("trainer") or {}).get("pid")
        return run if now.get("state") == "watching" and pid != old_pid and run and run[0] == pid else None
    return wait_for("the relaunched run", watching, timeout, lambda: supervisor_log(testbed))


def log_after(testbed, pid):
    text = sh(testbed, "cat /workspace/logs/train.log").stdout
    at = text.find(f"DFlash trainer pid={pid} ")
    assert at >= 0, text[-2000:]
    return text[at:]


@pytest.fixture(scope="module")
def supervised(testbed):
    """ct201 running the DataLoader trainer under its supervisor, without py-spy until its preflight
    pushes it; afterwards its run ended."""
    yield from testlib.supervised_run(testbed, NODE, VMID, CT, SETTINGS, [
        FAULT, "/workspace/checkpoints", f"{LIFECYCLE}/supervisor.json", f"{LIFECYCLE}/diagnostics", "/var/lib/dflash/bin"])


def test_1_a_sigkill_of_a_trainer_with_dataloader_workers_is_one_end_and_one_back_off(supervised):
    testbed = supervised
    pid, workers = wait_for("the trainer and its two DataLoader workers", lambda: trainer(testbed))
    wait_for("a checkpoint", lambda: "step_" in sh(testbed, "ls /workspace/checkpoints", check=False).stdout)
    before = state(testbed)
    sh(testbed, f"kill -KILL {pid}")
    new, new_workers = relaunched(testbed, pid)
    now = state(testbed)
    ends = now["ends"][len(before.get("ends") or []):]
    assert len(ends) == 1 and ends[0]["cause"] == "crash: the trainer killed by SIGKILL", ends
    assert ends[0]["leftovers"].startswith(f"2 leftover(s) of the dead run ended (PID {', '.join(map(str, sorted(workers)))}"), ends
    assert now["restarts"] == (before.get("restarts") or 0) + 1 and now["backoff_s"] == BACKOFF_S, now
    assert not set(workers) & set(run_processes(testbed)), "the old workers are gone"
    assert len(new_workers) == 2 and "resumed from" in log_after(testbed, new)


def test_2_a_make_restart_during_the_back_off_runs(supervised):
    testbed = supervised
    pid, _workers = trainer(testbed)
    sh(testbed, f"kill -KILL {pid}")
    wait_for("the back-off", lambda: state(testbed)["state"].startswith("backing off"), 30, lambda: supervisor_log(testbed))
    restarted = testlib.make("restart", f"HOST={CT}", extra=SETTINGS)
    assert restarted.returncode == 0, restarted.stdout[-4000:]
    new, _new_workers = wait_for("the restarted run", lambda: trainer(testbed))
    assert new != pid and (state(testbed).get("trainer") or {}).get("pid") == new, supervisor_log(testbed)
    time.sleep(BACKOFF_S + 2)  # the supervisor of the dead run stood down: nothing relaunches over the new run
    assert trainer(testbed)[0] == new, supervisor_log(testbed)


def test_3_a_trainer_blocked_for_ever_in_a_c_call_is_relaunched_from_its_newest_checkpoint(supervised):
    testbed = supervised
    pid, _workers = wait_for("the trainer", lambda: trainer(testbed))
    wait_for("a learned interval", lambda: (state(testbed).get("learned") or {}).get("timeout_s"))
    wait_for("a checkpoint of this run", lambda: re.search(r"step_\d+", sh(testbed, "ls /workspace/checkpoints").stdout))
    sh(testbed, f"echo hang-in-c > {FAULT}")
    new, _new_workers = relaunched(testbed, pid)
    end = state(testbed)["ends"][-1]
    assert end["kind"] == "hang" and end["cause"].startswith("hung: no progress line"), end
    # the hang's stop: SIGINT noted but never handled, its grace the run's cadence, then SIGTERM
    assert re.match(r"stopped: stopped PID \d+ at stage 2 \(SIGTERM\) in \d+(\.\d+)?s; no checkpoint from its stop: "
                    r"\d+ steps since step_\d+ lost$", end["stop"]), end
    took = float(re.search(r"in (\d+(?:\.\d+)?)s", end["stop"]).group(1))
    assert took < 15, f"a hang's SIGINT waits the run's cadence, not 120 s: {end['stop']}"
    # 0 when the hang came at the step of a periodic save (every 40 steps; it blocks at a tenth step)
    assert end["steps_lost"] >= 0 and end["relaunch"].endswith(f"resumed from {end['checkpoint']}"), end
    report = json.loads(sh(testbed, f"cat {shlex.quote(end['diagnostics'])}").stdout)
    main = next(p for p in report["processes"] if p["pid"] == pid)
    assert any(t["wchan"].startswith("futex") for t in main["threads"]), main["threads"]
    # every thread's Python stack, and the C frames of the one blocked in C
    assert "block_forever_in_c (train_dflash_pipeline.py" in main["py_spy"], main["py_spy"]
    assert "pthread_mutex_lock" in main["py_spy"], main["py_spy"]
    assert len(report["processes"]) == 3 and all(p["py_spy"].startswith("Process ") for p in report["processes"]), report
    assert re.search(rf"resumed from {re.escape(end['checkpoint'])} at step \d+", log_after(testbed, new))
    status = testlib.make("status", f"HOST={CT}")
    words = " ".join(status.stdout.split())
    assert re.search(r"hung: no progress line.*, \d+ steps lost", words), words[-3000:]
