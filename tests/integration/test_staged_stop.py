"""Fault matrix of dflash.lifecycle.staged_stop: the example trainer in a real CT (ct201),
started through pct exec without a tty, stopped by the module through the pct connection."""

import json
import os
import re
import shlex
import subprocess
import time

import ansible_runner
import pytest

from testlib import BIN, REPO, TESTBED_INVENTORY, TRAINER, run_tool

CT, NODE, VMID = "ct201", "pve1", "201"
OUT = "/workspace/ck"
PATTERN = "train_dflash_pipeline[.]py"
ARGS = ("--target-model /dev/shm/m --data-dir /workspace/data --output-dir /workspace/ck "
        "--target-gpus 0,1,2,3,4 --drafter-gpus 5,6,7 --profile-interval 5")
FAST_LADDER = [{"signal": "SIGINT", "scope": "main", "wait": 20},
               {"signal": "SIGTERM", "scope": "tree", "wait": 3},
               {"signal": "SIGKILL", "scope": "tree", "wait": 5}]


class CT201:
    def __init__(self, testbed):
        self.testbed = testbed

    def sh(self, command, check=True, timeout=60):
        return self.testbed.ssh(NODE, f"pct exec {VMID} -- sh -c {shlex.quote(command)}",
                                check=check, timeout=timeout)

    def trainer_pids(self):
        return [int(p) for p in self.sh(f"pgrep -f {PATTERN}", check=False).stdout.split()]

    def launch(self, env="", how="setsid", extra="", workers=0, ready_line="tok/s"):
        """how: setsid (own session, SIGINT at default), background (`nohup bash run.sh &`
        from a non-interactive bash: SIGINT ignored), wrapper (`bash run.sh &`, PGID 0)."""
        env = f"DFLASH_STEP_SECONDS=0.02 DFLASH_TEST_WORKERS={workers} {env}"
        script = f"cd /workspace\nexport {env}\npython3 -u /root/train_dflash_pipeline.py {ARGS} {extra}\n"
        self.testbed.ssh(NODE, f"pct exec {VMID} -- sh -c 'cat > /root/run.sh'", input=script,
                         check=True)
        if how == "setsid":
            launch = "setsid -f bash /root/run.sh > /workspace/train.log 2>&1 < /dev/null"
        elif how == "background":
            launch = "bash -c 'nohup bash /root/run.sh > /workspace/train.log 2>&1 < /dev/null &'"
        else:
            launch = "bash -c 'bash /root/run.sh > /workspace/train.log 2>&1 < /dev/null &'"
        self.sh(launch)
        self.wait(f"grep -qF {shlex.quote(ready_line)} /workspace/train.log", 30, f"no {ready_line!r} in the log",
                  lambda: self.sh("cat /workspace/train.log", check=False).stdout)

    def wait(self, condition, timeout, what, detail=None):
        self.testbed.wait_in_ct(NODE, VMID, condition, timeout, what, detail)

    def processes(self):
        return self.sh("ps -eo pid=,pgid=,sid=,args=").stdout


    def clean(self):
        """End what a test (or an interrupted earlier run) left: by PID, inside the CT."""
        for line in self.processes().splitlines():
            if any(mark in line for mark in ("train_dflash_pipeline", "run.sh", "sleep 600", "dflash-helper")):
                self.sh(f"kill -KILL {line.split()[0]}", check=False)
        self.sh("rm -f /run/dflash/trainer.pid", check=False)

    def alive(self, pid):
        return self.sh(f"test -d /proc/{pid}", check=False).returncode == 0

    def pid_of(self, pattern):
        return int(self.sh(f"pgrep -f {shlex.quote(pattern)}").stdout.split()[0])


@pytest.fixture
def ct(testbed):
    box = CT201(testbed)
    box.clean()
    box.testbed.ssh(NODE, f"pct push {VMID} {TRAINER} /root/train_dflash_pipeline.py", check=True)
    box.sh(f"rm -rf {OUT} /workspace/train.log && mkdir -p {OUT} /workspace/data /dev/shm/m")
    yield box
    box.clean()


def stop(tmp_path, check=False, expect_failure=False, **params):
    """Run the module through ansible-runner (as AWX does); its result and whether it failed. The
    example trainer's KeyboardInterrupt handler saves (saves_on=SIGINT), as the field's does."""
    params.setdefault("pattern", PATTERN)
    params.setdefault("saves_on", "SIGINT")
    (tmp_path / "runner").mkdir(parents=True, exist_ok=True)
    run = ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"), host_pattern=CT,
        inventory=TESTBED_INVENTORY,
        module="dflash.lifecycle.staged_stop", module_args=json.dumps(params),
        cmdline="--check" if check else None, quiet=True)
    outcomes = [(e["event"], e["event_data"]["res"]) for e in run.events
                if e["event"] in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable")]
    assert len(outcomes) == 1, run.stdout.read()
    event, result = outcomes[0]
    assert (event == "runner_on_failed") == expect_failure, json.dumps(result, indent=1)
    return result


def signals(result):
    return [(e["signal"], e["scope"]) for e in result["timeline"] if e["event"] == "signal"]


def test_1_well_behaved_stops_at_sigint_with_checkpoint(ct, tmp_path):
    ct.launch()
    result = stop(tmp_path, checkpoint_dir=OUT,
                  require_checkpoint=True, ladder=FAST_LADDER)
    assert result["stopped_by"] == {"stage": 0, "signal": "SIGINT", "scope": "main"}
    assert result["graceful_possible"] is True  # launched the right way: normal ladder
    assert signals(result) == [("SIGINT", "main")]
    assert result["checkpoint"]["written"] and result["checkpoint"]["new"].startswith(OUT + "/step_")
    assert result["timeline"][-1]["event"] == "stopped"
    assert result["survivors"] == [] and ct.trainer_pids() == []
    assert result["changed"] is True


def test_1b_the_interrupt_checkpoint_of_a_trainer_logging_every_10_steps_loses_nothing(ct, tmp_path):
    """The field's trainer logs every 10 steps and names no step when it saves on SIGINT (the
    step_regex here reads only its progress lines): its interrupt checkpoint is ahead of the
    log's last line and holds every step it made, so 0 are lost, not "not known"."""
    ct.launch(extra="--profile-interval 10")
    result = stop(tmp_path, checkpoint_dir=OUT, log_file="/workspace/train.log",
                  step_regex=r"\bstep (\d+) epoch", require_checkpoint=True, ladder=FAST_LADDER)
    loss = result["loss"]
    assert result["stopped_by"]["signal"] == "SIGINT" and result["checkpoint"]["written"], result["msg"]
    assert loss["checkpoint"] == result["checkpoint"]["new"] and loss["last_logged_step"] % 10 == 0
    # a SIGINT in the sleep of step N+10 saves N+10 before its progress line is printed
    assert loss["last_logged_step"] <= loss["checkpoint_step"] <= loss["last_logged_step"] + 10, loss
    assert (loss["steps_lost"], loss["ahead_of_log"], loss["saved_on_stop"]) == (0, None, True), loss
    assert "0 steps lost (the trainer saved on SIGINT and exited)" in result["msg"]


def test_2_background_launch_sigint_ignored_is_detected_and_skipped(ct, tmp_path):
    ct.launch(how="background")
    result = stop(tmp_path, no_graceful="proceed", ladder=[{"signal": "SIGINT", "scope": "main", "wait": 60},
                                    {"signal": "SIGTERM", "scope": "tree", "wait": 10},
                                    {"signal": "SIGKILL", "scope": "tree", "wait": 5}])
    assert result["signal_dispositions"]["SIGINT"] == "ignored"
    assert any("SIGINT is ignored" in note for note in result["notes"])
    assert result["timeline"][0]["event"] == "skipped"
    assert result["stopped_by"]["signal"] == "SIGTERM"
    assert result["timeline"][-1]["elapsed"] < 60  # the 60 s SIGINT wait was not waited out


def test_3_blocked_in_c_call_stops_at_sigint_once_it_returns(ct, tmp_path):
    ct.launch(env="DFLASH_TEST_BLOCK_IN_C_SECONDS=3", extra="--profile-interval 1")
    result = stop(tmp_path, checkpoint_dir=OUT, ladder=FAST_LADDER)
    assert result["stopped_by"]["signal"] == "SIGINT"
    assert result["checkpoint"]["written"]


def test_4a_growing_checkpoint_extends_the_wait(ct, tmp_path):
    ct.launch(env="DFLASH_TEST_SLOW_CHECKPOINT_SECONDS=6")
    result = stop(tmp_path, checkpoint_dir=OUT,
                  checkpoint_activity_window=2, graceful_wait_cap=60,
                  ladder=[{"signal": "SIGINT", "scope": "main", "wait": 2},
                          {"signal": "SIGKILL", "scope": "tree", "wait": 5}])
    assert signals(result) == [("SIGINT", "main")]  # no SIGKILL inside the cap
    extended = [e for e in result["timeline"] if e["event"] == "wait_extended"]
    assert extended and extended[0]["by"] > 0
    assert result["checkpoint"]["written"] and result["checkpoint"]["temp_files_left"] == []


def test_4b_quiet_checkpoint_dir_is_not_waited_on(ct, tmp_path):
    # the first step blocks 30 s in C: no checkpoint activity at all while SIGINT waits
    ct.launch(env="DFLASH_TEST_BLOCK_IN_C_SECONDS=30", ready_line="DFlash trainer pid=")
    time.sleep(1)
    result = stop(tmp_path, checkpoint_dir=OUT,
                  checkpoint_activity_window=2, graceful_wait_cap=60, on_missing_checkpoint="proceed",
                  ladder=[{"signal": "SIGINT", "scope": "main", "wait": 2},
                          {"signal": "SIGTERM", "scope": "tree", "wait": 5},
                          {"signal": "SIGKILL", "scope": "tree", "wait": 5}])
    assert not [e for e in result["timeline"] if e["event"] == "wait_extended"]
    assert ("SIGTERM", "tree") in signals(result)
    assert result["checkpoint"]["written"] is False and "NO new checkpoint" in result["msg"]


def test_5_ignores_sigint_and_sigterm_ends_at_sigkill_with_diagnostics(ct, tmp_path):
    ct.launch(env="DFLASH_TEST_IGNORE_SIGINT=1 DFLASH_TEST_IGNORE_SIGTERM=1")
    result = stop(tmp_path, no_graceful="proceed", ladder=FAST_LADDER)
    assert result["stopped_by"]["signal"] == "SIGKILL"
    assert [s for s, _ in signals(result)] == ["SIGTERM", "SIGKILL"]  # SIGINT skipped
    diag = result["diagnostics"]
    assert diag["threads"] and all({"tid", "state", "wchan"} <= set(t) for t in diag["threads"])
    assert diag["py_spy"]  # the dump, or why there is none


def test_6_wrapper_trainer_workers_with_pgid_0_nothing_left(ct, tmp_path):
    ct.launch(how="wrapper", workers=3)
    before = ct.processes()
    trainer_lines = [line for line in before.splitlines() if "train_dflash" in line]
    assert len(trainer_lines) == 4  # the trainer and 3 forked workers
    assert all(line.split()[1:3] == ["0", "0"] for line in trainer_lines)  # PGID 0, SID 0
    result = stop(tmp_path, include_wrapper=True, no_graceful="proceed", ladder=FAST_LADDER)
    roles = sorted(t["role"] for t in result["targets"])
    assert roles == ["descendant"] * 3 + ["main", "wrapper"]
    assert result["survivors"] == []
    after = ct.processes()
    assert "train_dflash" not in after and "run.sh" not in after


def test_7_nothing_running(ct, tmp_path):
    result = stop(tmp_path)
    assert result["changed"] is False and result["timeline"] == []
    assert result["msg"].startswith("no trainer running")


def test_8_two_matches_fail_and_nothing_is_signalled(ct, tmp_path):
    ct.launch()
    ct.sh("cd /workspace && setsid -f python3 -u /root/train_dflash_pipeline.py "
          f"{ARGS.replace(OUT, OUT + '2')} > /workspace/second.log 2>&1 < /dev/null")
    pids = ct.trainer_pids()
    assert len(pids) == 2
    result = stop(tmp_path, expect_failure=True)
    assert sorted(m["pid"] for m in result["matches"]) == sorted(pids)
    assert "Nothing was signalled" in result["msg"]
    assert sorted(ct.trainer_pids()) == sorted(pids)
    assert "KeyboardInterrupt" not in ct.sh("cat /workspace/train.log").stdout


def test_9_stale_pidfile_names_another_process(ct, tmp_path):
    ct.sh("touch -d '1 hour ago' /workspace/stale.pid; setsid -f sleep 600 < /dev/null "
          "> /dev/null 2>&1")
    other = ct.sh("pgrep -x -f 'sleep 600'").stdout.split()[0]
    ct.sh(f"echo {other} > /workspace/stale.pid && touch -d '1 hour ago' /workspace/stale.pid")
    result = stop(tmp_path, pidfile="/workspace/stale.pid", pattern=None)
    assert result["changed"] is False
    assert result["found"]["pidfile_stale"] is True
    assert "started after the pidfile was written" in result["found"]["pidfile_reason"]
    assert ct.sh(f"kill -0 {other}", check=False).returncode == 0  # not signalled


def test_10_check_mode_signals_nothing(ct, tmp_path):
    ct.launch()
    pids = ct.trainer_pids()
    result = stop(tmp_path, check=True, checkpoint_dir=OUT)
    assert result["changed"] is True and result["stopped"] is False
    assert result["timeline"] == []
    assert [t["pid"] for t in result["targets"] if t["role"] == "main"] == pids
    assert [s["signal"] for s in result["ladder"]] == ["SIGINT", "SIGTERM", "SIGKILL"]
    time.sleep(0.5)
    assert ct.trainer_pids() == pids
    assert "KeyboardInterrupt" not in ct.sh("cat /workspace/train.log").stdout


def test_pidfile_identity_is_used_first(ct, tmp_path):
    ct.launch()
    (pid,) = ct.trainer_pids()
    start = ct.sh(f"cut -d')' -f2 /proc/{pid}/stat").stdout.split()[19]
    ct.sh(f"echo '{pid} {start}' > /workspace/trainer.pid")
    result = stop(tmp_path, pidfile="/workspace/trainer.pid", ladder=FAST_LADDER)
    assert result["found"]["source"] == "pidfile"
    assert result["stopped_by"]["signal"] == "SIGINT"


def test_bad_ladder_names_the_entry(ct, tmp_path):
    result = stop(tmp_path, expect_failure=True,
                  ladder=[{"signal": "SIGINT", "scope": "everything", "wait": 1}])
    assert "ladder[0].scope" in result["msg"]


def test_ansible_doc_renders_the_module():
    res = run_tool([os.path.join(BIN, "ansible-doc"), "dflash.lifecycle.staged_stop"])
    assert "graceful_wait_cap" in res.stdout and "other_gpu_holders" in res.stdout
    assert REPO  # run from the repository's ansible.cfg


def test_trainer_stop_role_check_mode_then_real(ct, testbed):
    ct.launch()
    pids = ct.trainer_pids()
    playbook = os.path.join(REPO, "playbooks", "stop.yml")
    res = testbed.playbook(playbook, "-l", CT, "--check", "-e", f"trainer_run_checkpoint_dir={OUT}")
    assert "would stop PID" in res.stdout and ct.trainer_pids() == pids
    res = testbed.playbook(playbook, "-l", CT, "-e", f"trainer_run_checkpoint_dir={OUT}",
                           "-e", "trainer_stop_require_checkpoint=true")
    assert "at stage 1 (SIGINT)" in res.stdout and "new checkpoint" in res.stdout
    assert ct.trainer_pids() == []
    res = testbed.playbook(playbook, "-l", CT)  # nothing running: ok, not changed
    assert "changed=0" in res.stdout and "no trainer running" in res.stdout


# -- when no signal can make the trainer checkpoint (legacy `nohup bash run.sh &` launch) --------

PERIODIC = "--save-interval 100 --profile-interval 1"  # 0.02 s steps: a checkpoint every ~2 s


def launch_legacy_with_history(ct, workers=0):
    ct.launch(how="background", extra=PERIODIC, workers=workers)
    ct.wait(f"[ $(ls {OUT} | grep -c '^step_') -ge 2 ]", 30, "no periodic checkpoints")


def last_step_in_log(ct):
    return max(int(m) for m in re.findall(r"\bstep (\d+)\b", ct.sh("cat /workspace/train.log").stdout))


def test_no_graceful_wait_for_checkpoint_stops_right_after_it(ct, tmp_path):
    launch_legacy_with_history(ct, workers=2)
    result = stop(tmp_path, checkpoint_dir=OUT,
                  log_file="/workspace/train.log", ladder=FAST_LADDER)
    assert result["graceful_possible"] is False
    assert result["graceful_reason"].startswith("SIGINT is ignored by PID")
    assert "SIGTERM is not caught" in result["graceful_reason"]
    landed = [e for e in result["timeline"] if e["event"] == "checkpoint_landed"]
    sent = [e for e in result["timeline"] if e["event"] == "signal"]
    assert len(landed) == 1 and [(e["signal"], e["scope"]) for e in sent] == [("SIGTERM", "tree")]
    assert sent[0]["t"] - landed[0]["t"] < 1.0
    loss = result["loss"]
    assert loss["last_logged_step"] == last_step_in_log(ct)
    if loss["ahead_of_log"] is not None:
        # the trainer saves a step before it logs it: the SIGTERM came between the two (under load),
        # and the loss is said as the checkpoint ahead of the log, never counted
        assert loss["steps_lost"] is None and loss["ahead_of_log"] == loss["checkpoint_step"] - loss["last_logged_step"]
        assert f"is {loss['ahead_of_log']} steps ahead" in result["msg"], result["msg"]
    else:
        assert loss["steps_lost"] == loss["last_logged_step"] - loss["checkpoint_step"]
        assert loss["steps_lost"] <= 50  # under a second of 20 ms steps
    assert loss["checkpoint"] == landed[0]["path"]
    after = ct.processes()
    assert "train_dflash" not in after and "run.sh" not in after  # workers included


def test_no_graceful_fail_signals_nothing_and_reports(ct, tmp_path):
    launch_legacy_with_history(ct)
    pids = ct.trainer_pids()
    check = stop(tmp_path / "check", check=True, checkpoint_dir=OUT,
                 log_file="/workspace/train.log")
    assert "no graceful checkpoint: SIGINT is ignored" in check["msg"] and "s old" in check["msg"]
    result = stop(tmp_path, expect_failure=True, no_graceful="fail", checkpoint_dir=OUT,
                  log_file="/workspace/train.log")
    assert "SIGINT is ignored by PID" in result["msg"] and "Nothing was signalled" in result["msg"]
    assert "s old" in result["msg"] and "no_graceful=proceed" in result["msg"]
    assert result["timeline"] == [] and ct.trainer_pids() == pids


def test_no_graceful_proceed_ends_by_the_ladder_and_says_what_was_lost(ct, tmp_path):
    launch_legacy_with_history(ct)
    result = stop(tmp_path, no_graceful="proceed", checkpoint_dir=OUT,
                  log_file="/workspace/train.log",
                  ladder=FAST_LADDER)
    assert result["stopped_by"]["signal"] == "SIGTERM"
    assert result["loss"]["steps_lost"] == last_step_in_log(ct) - result["loss"]["checkpoint_step"]
    loss = result["loss"]
    unlogged = (loss["log_every"] or 1) - 1  # made after the log's last line, lost too
    assert loss["steps_lost_up_to"] == loss["steps_lost"] + unlogged, loss
    lost = f"{loss['steps_lost']}" + (f" to {loss['steps_lost_up_to']}" if unlogged else "")
    assert f"{lost} steps after the newest checkpoint lost" in result["msg"]


def test_no_graceful_without_checkpoint_history_fails_without_killing(ct, tmp_path):
    ct.launch(how="background")  # no --save-interval: no periodic checkpoints
    pids = ct.trainer_pids()
    result = stop(tmp_path, expect_failure=True, checkpoint_dir=OUT)
    assert "shows no periodic checkpoint history" in result["msg"]
    assert "Nothing was signalled" in result["msg"] and ct.trainer_pids() == pids


# -- touch exactly the run (run identity, bystanders, other GPU holders) ---------------------------

def launch_with_identity(tmp_path, env="", extra=""):
    """The trainer as dflash.lifecycle.trainer_process starts it: its own session, a run identity."""
    command = (["/usr/bin/env", "DFLASH_STEP_SECONDS=0.02", *env.split(), "/usr/bin/python3", "-u",
                "/root/train_dflash_pipeline.py", *ARGS.split(), *extra.split()])
    (tmp_path / "launch").mkdir()
    run = ansible_runner.run(
        private_data_dir=str(tmp_path / "launch"), host_pattern=CT,
        inventory=TESTBED_INVENTORY, module="dflash.lifecycle.trainer_process",
        module_args=json.dumps({"command": command, "cwd": "/workspace", "pidfile": "/run/dflash/trainer.pid",
                                "log_file": "/workspace/train.log", "health_seconds": 0.5}), quiet=True)
    (result,) = [e["event_data"]["res"] for e in run.events if e["event"] == "runner_on_ok"]
    return result


def test_a_gpu_process_of_another_pct_exec_session_survives_the_stop(ct, testbed, tmp_path):
    ct.launch()
    # an operator's GPU tool in a pct exec session of its own, started after the trainer:
    # PPID 0 inside the CT (its parent, lxc-attach, lives outside the CT's PID namespace)
    session = subprocess.Popen(
        ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={testbed.bed.known_hosts}",
         "-i", testbed.bed.key, "-p", str(testbed.bed.nodes[NODE]["port"]),
         f"root@{testbed.bed.nodes[NODE]['address']}",
         f"pct exec {VMID} -- sh -c 'exec 3</dev/nvidia5; exec sleep 6001'"])
    try:
        ct.wait("pgrep -x -f 'sleep 6001' > /dev/null", 20, "the GPU tool of the other session never ran")
        other = ct.pid_of("sleep 6001")
        assert ct.sh(f"cut -d' ' -f4 /proc/{other}/stat").stdout.strip() == "0"  # PPID 0 for real
        result = stop(tmp_path, checkpoint_dir=OUT, ladder=FAST_LADDER)
        assert result["stopped_by"]["signal"] == "SIGINT" and ct.trainer_pids() == []
        assert ct.alive(other), "the other session's GPU process was signalled"
        assert [(o["pid"], o["devices"], o["ppid"]) for o in result["other_gpu_holders"]] == [
            (other, ["/dev/nvidia5"], 0)]
        assert other not in [t["pid"] for t in result["targets"]]
    finally:
        session.terminate()
        session.wait()
        ct.clean()


def test_a_setsid_helper_of_a_launched_run_is_stopped_with_it(ct, tmp_path):
    launched = launch_with_identity(tmp_path, env="DFLASH_TEST_SETSID_HELPER=1")
    helper = ct.pid_of("dflash-helper")
    stat = ct.sh(f"cut -d')' -f2 /proc/{helper}/stat").stdout.split()
    assert stat[1] == "1" and stat[3] == str(helper)  # reparented to init, a session of its own
    assert f"DFLASH_RUN_ID={launched['run_id']}" in ct.sh(f"tr '\\0' '\\n' < /proc/{helper}/environ").stdout
    sigint_wait = 300
    result = stop(tmp_path, pidfile="/run/dflash/trainer.pid", checkpoint_dir=OUT,
                  ladder=[dict(FAST_LADDER[0], wait=sigint_wait), *FAST_LADDER[1:]])
    assert result["run_id"] == launched["run_id"]
    assert {t["pid"]: t["role"] for t in result["targets"]}[helper] == "run identity"
    assert not ct.alive(helper) and ct.trainer_pids() == []
    assert result["checkpoint"]["written"]
    # the main process left with its checkpoint; the helper SIGINT never reached does not hold
    # the SIGINT stage for its whole wait: SIGTERM follows within the grace after the main's exit
    (term,) = [e for e in result["timeline"] if e["event"] == "signal" and e["signal"] == "SIGTERM"]
    assert term["pids"] == [helper] and term["elapsed"] < sigint_wait


def test_legacy_trainer_from_a_login_session_leaves_its_shell_sibling_and_daemon(ct, tmp_path):
    # a real session (as ssh, pct enter or tmux make): the login shell leads it, the trainer and a
    # sibling job share its session and process group
    ct.sh("cd /workspace && setsid -f bash -l -c 'DFLASH_STEP_SECONDS=0.02 python3 -u "
          f"/root/train_dflash_pipeline.py {ARGS} > /workspace/train.log 2>&1 & sleep 600 & wait' "
          "< /dev/null > /dev/null 2>&1")
    ct.wait("grep -q tok/s /workspace/train.log", 30, "no progress line")
    trainer = ct.pid_of("^python3 -u /root/train_dflash_pipeline")  # the shell's own cmdline matches too
    sibling = ct.pid_of("^sleep 600$")
    shell = int(ct.sh(f"cut -d')' -f2 /proc/{sibling}/stat").stdout.split()[1])
    # a GPU daemon started after the trainer, in a session of its own
    ct.sh("setsid -f sh -c 'exec 3</dev/nvidia6; exec sleep 6001' < /dev/null > /dev/null 2>&1")
    daemon = ct.pid_of("sleep 6001")
    session = ct.sh(f"ps -o sid= -p {trainer} {sibling} {shell}").stdout.split()
    assert len(set(session)) == 1 and session[0] == str(shell)
    result = stop(tmp_path, include_wrapper=True, no_graceful="proceed", ladder=FAST_LADDER)
    assert [t["pid"] for t in result["targets"]] == [trainer]
    assert not ct.alive(trainer)
    assert ct.alive(shell) and ct.alive(sibling) and ct.alive(daemon)
    assert daemon in [o["pid"] for o in result["other_gpu_holders"]]


def test_sigterm_handler_gets_the_checkpoint_wait_when_sigint_is_ignored(ct, tmp_path):
    ct.launch(how="background", env="DFLASH_TEST_SAVES_ON=SIGINT,SIGTERM DFLASH_TEST_SLOW_CHECKPOINT_SECONDS=6")
    result = stop(tmp_path, checkpoint_dir=OUT, checkpoint_activity_window=2, saves_on="SIGTERM",
                  ladder=[{"signal": "SIGINT", "scope": "main", "wait": 30},
                          {"signal": "SIGTERM", "scope": "tree", "wait": 2},
                          {"signal": "SIGKILL", "scope": "tree", "wait": 5}])
    assert result["graceful_possible"] is True and result["graceful_stage"] == 1
    assert signals(result) == [("SIGTERM", "tree")]  # no SIGKILL in the middle of the save
    assert [e["stage"] for e in result["timeline"] if e["event"] == "wait_extended"] == [1]
    assert result["checkpoint"]["written"] and result["stopped_by"]["signal"] == "SIGTERM"


def test_an_in_place_checkpoint_is_waited_for_until_it_is_done(ct, tmp_path):
    # legacy launch (SIGINT ignored), periodic checkpoints written in place and slowly
    ct.launch(how="background", extra=PERIODIC,
              env="DFLASH_TEST_CHECKPOINT_IN_PLACE=1 DFLASH_TEST_SLOW_CHECKPOINT_SECONDS=2")
    ct.wait(f"[ $(ls {OUT}/*/COMPLETE 2>/dev/null | wc -l) -ge 2 ]", 60, "no periodic checkpoint history")
    result = stop(tmp_path, checkpoint_dir=OUT, ladder=FAST_LADDER)
    (landed,) = [e["path"] for e in result["timeline"] if e["event"] == "checkpoint_landed"]
    # the landed checkpoint was whole when the trainer was stopped (no truncated save)
    assert ct.sh(f"test -f {landed}/COMPLETE", check=False).returncode == 0
    assert result["loss"]["checkpoint"] == landed


def test_the_stop_sleeps_while_the_trainer_writes_its_checkpoint(ct, tmp_path):
    # the workers end at once (the trainer stops them first), the checkpoint takes 10 s: the
    # wait must not spin on their exited pidfds nor walk the directory in a loop
    ct.launch(workers=2, env="DFLASH_TEST_SLOW_CHECKPOINT_SECONDS=10")
    result = stop(tmp_path, checkpoint_dir=OUT,
                  ladder=[{"signal": "SIGINT", "scope": "main", "wait": 60},
                          {"signal": "SIGKILL", "scope": "tree", "wait": 5}])
    assert result["stopped_by"]["signal"] == "SIGINT" and result["timeline"][-1]["elapsed"] >= 10
    assert result["cpu_s"] < 0.5, f"the stop used {result['cpu_s']} CPU-s while it waited"


def test_a_long_stop_shows_its_progress_in_the_playbook_output(ct, testbed):
    # SIGINT, then a checkpoint that takes 22 s to write: past 10 s the controller shows a line
    # every 5 s, the bytes written growing; a stop that ends at once shows none (other tests)
    ct.launch(env="DFLASH_TEST_SLOW_CHECKPOINT_SECONDS=22")
    res = testbed.playbook(os.path.join(REPO, "playbooks", "stop.yml"), "-l", CT,
                           "-e", json.dumps({"trainer_run_checkpoint_dir": OUT, "trainer_run_log_file": "/workspace/train.log"}))
    # (no checkpoint before this one: every step the run logged is not in a checkpoint yet)
    lines = re.findall(r"ct201: stop stage 1 \(SIGINT\): ([0-9.]+)s of 120(?:\.0)?s, \d+ process\(es\) of the run still "
                       r"running, checkpoint \+([0-9.]+) MB written, [1-9]\d* steps not in a checkpoint yet\n", res.stdout)
    assert len(lines) >= 2, res.stdout
    waited = [float(w) for w, _mb in lines]
    written = [float(mb) for _w, mb in lines]
    # the first line comes 10 s into the task, which also holds the stop's work before its signal
    # (seconds on a loaded machine): nothing is shown in the stage's first few seconds
    assert waited[0] >= 5 and waited == sorted(waited) and written[-1] > written[0] > 0, lines
    assert "at stage 1 (SIGINT)" in res.stdout and ct.trainer_pids() == []
