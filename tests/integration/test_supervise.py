"""The run's supervisor in the CT (module_utils/agent/supervise.py), on the testbed's ct200 with the
example trainer and its stop request helper (the heartbeat): a trainer killed with SIGKILL and one
that raises run again from their newest checkpoint after the back-off; one stopped with SIGSTOP and
one asleep in its loop are declared hung within a few of their own intervals, with diagnostics kept,
and restarted; a trainer that crashes at every start stops after the crash-loop bound and is
reported down with each cause, and the next redeploy names the restarts; `make stop` and
`make restart` are never undone; a bad setting is refused naming its variable before anything is
touched."""

import json
import os
import re
import shlex
import time

import pytest

import testlib
from testlib import REPO, wait_for

CT, NODE, VMID = "ct200", "pve1", 200
REDEPLOY = os.path.join(REPO, "redeploy.yml")
LIFECYCLE = "/var/lib/dflash/lifecycle"
FAULT = "/run/dflash-test-fault"
BACKOFF_S, BACKOFF_MAX_S, FLOOR_S, FACTOR, LOOP_BOUND = 1, 2, 2, 3, 4
SETTINGS = {
    "trainer_launch_health_seconds": 1,
    "trainer_launch_supervise_backoff_s": BACKOFF_S,
    "trainer_launch_supervise_backoff_max_s": BACKOFF_MAX_S,
    "trainer_launch_supervise_hang_floor_s": FLOOR_S,
    "trainer_launch_supervise_hang_factor": FACTOR,
    "trainer_launch_supervise_crash_loop_restarts": LOOP_BOUND,
    "dflash_profile_interval": 10,
    "dflash_extra_args": ["--save-interval", "100"],
    # the stop request's helper: its looks are the supervisor's heartbeat
    "dflash_env": {"PYTHONUNBUFFERED": "1", "DFLASH_TEST_FAULT_FILE": FAULT, "DFLASH_TEST_STOP_REQUEST": "take",
                   "DFLASH_STOP_REQUEST_EVERY": "5"},
}


def sh(testbed, command, check=True):
    return testbed.in_ct(NODE, VMID, command, check=check, timeout=120)


def make(*args, extra=SETTINGS):
    return testlib.make(*args, extra=extra)


def trainer_pid(testbed):
    found = sh(testbed, "pgrep -f 'train_dflash_pipeline[.]py' || true", check=False).stdout.split()
    return int(found[0]) if len(found) == 1 else None


def supervisors(testbed):
    return [int(p) for p in sh(testbed, "pgrep -f 'agent[.]zip supervise' || true", check=False).stdout.split()]


def state(testbed):
    return json.loads(sh(testbed, f"cat {LIFECYCLE}/supervisor.json").stdout)


def relaunched(testbed, old_pid):
    """The new trainer's PID once the supervisor's relaunch of the run is healthy (its state says
    watching a trainer other than old_pid)."""
    def watching():
        now = state(testbed)
        pid = (now.get("trainer") or {}).get("pid")
        return pid if now.get("state") == "watching" and pid != old_pid and trainer_pid(testbed) == pid else None
    return wait_for("the relaunched run", watching, 60,
                    lambda: sh(testbed, f"tail -n 20 {LIFECYCLE}/supervisor.log", check=False).stdout)


def log_after(testbed, pid):
    """The run's log from the launch line of the trainer with this PID on."""
    text = sh(testbed, "cat /workspace/logs/train.log").stdout
    at = text.find(f"DFlash trainer pid={pid} ")
    assert at >= 0, text[-2000:]
    return text[at:]


def status_text():
    status = make("status", f"HOST={CT}", extra=None)
    assert status.returncode == 0, status.stdout[-3000:]
    return " ".join(status.stdout.split())


@pytest.fixture(scope="module")
def supervised(testbed):
    """ct200 running the example trainer under its supervisor; afterwards the run and its supervisor ended."""
    yield from testlib.supervised_run(testbed, NODE, VMID, CT, SETTINGS, [
        FAULT, "/workspace/checkpoints", f"{LIFECYCLE}/supervisor.json", f"{LIFECYCLE}/diagnostics"])


def test_1_a_trainer_killed_with_sigkill_runs_again_from_its_newest_checkpoint(supervised):
    testbed = supervised
    pid = wait_for("the supervised trainer", lambda: trainer_pid(testbed))
    assert supervisors(testbed) == [int(sh(testbed, f"ps -o ppid= -p {pid}").stdout)], "the trainer's parent supervises it"
    wait_for("a checkpoint", lambda: "step_" in sh(testbed, "ls /workspace/checkpoints", check=False).stdout)
    sh(testbed, f"kill -KILL {pid}")
    new = relaunched(testbed, pid)
    end = state(testbed)["ends"][-1]
    assert end["cause"] == "crash: the trainer killed by SIGKILL" and end["exit"] == {"signal": "SIGKILL", "code": None}
    assert end["checkpoint"] and end["relaunch"].endswith(f"resumed from {end['checkpoint']}"), end
    assert re.search(rf"resumed from {re.escape(end['checkpoint'])} at step \d+", log_after(testbed, new))
    words = status_text()
    assert f"supervisor: 'watching trainer PID {new} (supervisor PID" in words, words
    assert "1 restarts since the launch; ends: " in words and "crash: the trainer killed by SIGKILL" in words, words


def test_2_a_trainer_that_raises_runs_again_and_its_traceback_is_kept(supervised):
    testbed = supervised
    pid = trainer_pid(testbed)
    sh(testbed, f"echo raise > {FAULT}")
    new = relaunched(testbed, pid)
    end = state(testbed)["ends"][-1]
    assert end["cause"].startswith("crash: the trainer exited with status 1 (RuntimeError: a bad batch at step"), end
    assert end["traceback"][0].startswith("Traceback (most recent call last):")
    assert "resumed from" in log_after(testbed, new)


@pytest.mark.parametrize("how", ["SIGSTOP", "a sleep in its loop"])
def test_3_a_silent_trainer_is_declared_hung_within_a_few_intervals_diagnosed_and_restarted(supervised, how):
    testbed = supervised
    pid = trainer_pid(testbed)
    wait_for("a learned interval", lambda: (state(testbed).get("learned") or {}).get("timeout_s"))
    sh(testbed, f"kill -STOP {pid}" if how == "SIGSTOP" else f"echo hang > {FAULT}")
    new = relaunched(testbed, pid)
    end = state(testbed)["ends"][-1]
    found = re.match(r"hung: no progress line or heartbeat for ([\d.]+) s \(the longest interval it showed: "
                     r"([\d.]+) s; timeout ([\d.]+) s\)", end["cause"])
    assert found, end
    # the words' figures are the end's, rounded: the exact ones tell a silence just past its timeout
    assert [float(figure) for figure in found.groups()] == [round(end["silent_s"], 2), end["interval_s"],
                                                          round(end["timeout_s"], 2)], end
    silent, interval, timeout = end["silent_s"], end["interval_s"], end["timeout_s"]
    # declared at the first tick past the learned timeout: a few of its own intervals
    assert abs(timeout - max(FLOOR_S, FACTOR * interval)) < 0.05 and timeout < silent <= timeout + 1.5, end
    report = json.loads(sh(testbed, f"cat {shlex.quote(end['diagnostics'])}").stdout)
    threads = [t for p in report["processes"] if p["pid"] == pid for t in p["threads"]]
    assert threads and all(t["state"] == ("T" if how == "SIGSTOP" else "S") for t in threads), report
    assert "nvidia_smi" in report and report["processes"][0]["py_spy"]
    assert end["stop"].startswith("stopped: stopped PID"), end
    assert "resumed from" in log_after(testbed, new)


def test_4_make_stop_and_make_restart_are_never_undone(supervised):
    testbed = supervised
    before = len(state(testbed)["ends"])
    stopped = make("stop", f"HOST={CT}")
    assert stopped.returncode == 0, stopped.stdout[-3000:]
    time.sleep(BACKOFF_MAX_S + 3)  # longer than a restart's back-off
    assert trainer_pid(testbed) is None and supervisors(testbed) == []
    now = state(testbed)
    assert now["state"] == "stood down" and now["why"].startswith("the stop of ") and len(now["ends"]) == before, now
    started = make("start", f"HOST={CT}")
    assert started.returncode == 0, started.stdout[-3000:]
    first = wait_for("the started run", lambda: trainer_pid(testbed))
    restarted = make("restart", f"HOST={CT}")
    assert restarted.returncode == 0, restarted.stdout[-3000:]
    time.sleep(BACKOFF_MAX_S + 3)
    second = trainer_pid(testbed)
    assert second not in (None, first)
    assert supervisors(testbed) == [int(sh(testbed, f"ps -o ppid= -p {second}").stdout)]
    assert state(testbed).get("ends") in (None, []), "a job's launch begins the count afresh"


def test_5_a_crash_loop_leaves_the_run_down_with_each_cause_and_the_next_redeploy_names_it(supervised):
    testbed = supervised
    pid = trainer_pid(testbed)
    sh(testbed, f"echo crash-at-start > {FAULT}; kill -KILL {pid}")
    wait_for("the run left down", lambda: state(testbed)["state"] == "DOWN", timeout=90)
    now = state(testbed)
    assert trainer_pid(testbed) is None and supervisors(testbed) == []
    assert now["why"].startswith(f"crash loop: {LOOP_BOUND} restarts within 3600 s, and it ended again: "
                                 "crash: the trainer killed by SIGKILL; the relaunch failed: "), now["why"]
    assert now["why"].count("RuntimeError: crash at start requested by") == LOOP_BOUND, now["why"]
    assert "supervisor: 'DOWN: crash loop" in status_text()
    sh(testbed, f"rm -f {FAULT}")
    again = testbed.playbook(REDEPLOY, "-l", CT, "-e", json.dumps(SETTINGS), check=False)
    assert again.returncode == 0, again.stdout[-3000:]
    assert re.search(rf"before this job, the supervisor saw {LOOP_BOUND + 1} end\(s\) of the run since the last job: "
                     r".* crash: the trainer killed by SIGKILL", " ".join(again.stdout.split())), again.stdout[-3000:]


@pytest.mark.parametrize("variable, value, words", [
    ("trainer_launch_supervise_backoff_s", -1, "trainer_launch_supervise_backoff_s: -1 must be at least 0"),
    ("trainer_launch_supervise_restart", "always", "trainer_launch_supervise_restart must be one of: never, on-failure"),
    ("trainer_launch_supervise_backoff_s", 3,
     "trainer_launch_supervise_backoff_max_s: 2 must be at least trainer_launch_supervise_backoff_s (3)"),
])
def test_6_a_bad_setting_is_refused_naming_its_variable_before_anything_is_touched(supervised, variable, value, words):
    testbed = supervised
    pid = trainer_pid(testbed)
    refused = testbed.playbook(REDEPLOY, "-l", CT, "-e", json.dumps(dict(SETTINGS, **{variable: value})), check=False)
    assert refused.returncode != 0 and words in " ".join(refused.stdout.split()), refused.stdout[-3000:]
    assert trainer_pid(testbed) == pid
