"""Fault injection: the controller's connection to the node drops in the middle of a stop."""

import functools
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from testlib import BIN, END_RUNS, END_SUPERVISORS, REPO, TESTBED_INVENTORY, TRAINER, task_ran, tool_env, trainer_source
from test_staged_stop import CT, FAST_LADDER, NODE, OUT, PATTERN, VMID, ct, stop  # noqa: F401  (ct: fixture)

EXTRA = os.environ.get("DFLASH_FAULT_EXTRA", "").split()  # to try variants by hand


def masters_to(address, tests_own, port=2222):
    """PIDs of the ssh client processes (ControlMasters) connected to address:port, but for the
    tests' own (their ControlPath begins with tests_own): the drop cuts ansible's connection."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", "dst", f"{address}:{port}"],
                         capture_output=True, text=True, check=True).stdout
    masters = set()
    for pid in {int(p) for p in re.findall(r'"ssh",pid=(\d+)', out)}:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                ours = f"ControlPath={tests_own}".encode() in handle.read()
        except OSError:  # gone since ss listed it
            continue
        if not ours:
            masters.add(pid)
    return sorted(masters)


def in_ct(testbed, node, vmid, command, check=True, timeout=60):
    return testbed.in_ct(node, vmid, command, check=check, timeout=timeout)


def wait_for_checkpoint_history(testbed, node, vmid, directory, timeout):
    """Until a legacy trainer has written two periodic checkpoints: a stop that cannot make it
    checkpoint waits for the next one, at the interval these give."""
    testbed.wait_in_ct(node, vmid, f"[ $(ls {directory} | grep -c '^step_') -ge 2 ]", timeout,
                       "no periodic checkpoint history")


def wait_for_no_trainer(testbed, node, vmid, pattern, timeout, output):
    testbed.wait_in_ct(node, vmid, f"! pgrep -f '{pattern}' > /dev/null", timeout, "a trainer still runs",
                       lambda: output)


def drop_connection_mid_stop(testbed, sh, address, playbook_args, after_drop=lambda: None):
    """Run ansible-playbook with playbook_args and, once the stop's detached worker is under way in
    the CT, kill the controller's ControlMasters to the node at address; after_drop runs right then.
    Returns the playbook's exit status and output."""
    # stdin: ansible-core refuses a non-blocking one, which a test runner's may be
    playbook = subprocess.Popen([os.path.join(BIN, "ansible-playbook"), *playbook_args], cwd=REPO,
                                env=tool_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL)
    try:
        # watched from inside the CT, one call: a poll per round trip could miss a short stop
        seen = sh("timeout 150 sh -c 'until test -s /run/dflash/stop.worker; do sleep 0.02; done'", check=False,
                  timeout=180)
        if seen.returncode != 0 or playbook.poll() is not None:
            playbook.kill()
            raise AssertionError(f"the stop's worker was never seen running: {playbook.communicate()[0][-4000:]}")
        killed = masters_to(address, testbed.control_path_prefix())
        assert killed, "no ControlMaster to the node: nothing to drop"
        for pid in killed:  # started by the playbook above: ours, ended by PID
            os.kill(pid, 9)
        after_drop()
        output = playbook.communicate(timeout=300)[0]
    finally:
        if playbook.poll() is None:
            playbook.kill()
    return playbook.returncode, output


def test_stop_survives_a_dropped_controller_connection(ct, testbed):
    # a legacy launch (SIGINT ignored) with periodic checkpoints: the stop first waits for the
    # next checkpoint, and the connection is cut while it waits, before any signal was sent
    # (a checkpoint every 25 s, the stop begun after one: the playbook's start and the drop took
    # up to 15 s on a machine running four test files at once; the stop's own timeline says
    # whether they came first)
    ct.launch(how="background", extra="--save-interval 1250 --profile-interval 5")
    wait_for_checkpoint_history(testbed, NODE, VMID, OUT, timeout=110)
    dropped = []
    _status, output = drop_connection_mid_stop(
        testbed, ct.sh, testbed.bed.nodes[NODE]["address"],
        [os.path.join(REPO, "playbooks", "stop.yml"), "-l", CT, "-e", f"trainer_run_checkpoint_dir={OUT}",
         "-e", "trainer_run_log_file=/workspace/train.log", *EXTRA], after_drop=lambda: dropped.append(time.time()))
    # whatever the controller saw, the stop ran to its end inside the CT
    wait_for_no_trainer(testbed, NODE, VMID, PATTERN, 60, output)
    # the stop's worker left its result: its first signal went after the drop (the CT's clock is
    # the host's), once the periodic checkpoint it waited for had landed
    stop_result = json.loads(ct.sh("cat /run/dflash/stop.result.json").stdout)["result"]
    events = {e["event"]: e for e in reversed(stop_result["timeline"])}
    assert events["signal"]["at"] > dropped[0] and "checkpoint_landed" in events, (dropped, stop_result["timeline"])
    assert stop_result["checkpoint"]["written"], stop_result["msg"]
    # a rerun converges: nothing left to stop
    rerun = testbed.playbook(os.path.join(REPO, "playbooks", "stop.yml"), "-l", CT,
                             "-e", f"trainer_run_checkpoint_dir={OUT}")
    assert "no trainer running" in rerun.stdout and "failed=0" in rerun.stdout


REDEPLOY = os.path.join(REPO, "redeploy.yml")
SEED = os.path.join(REPO, "playbooks", "testbed_seed.yml")


def in_ct300(testbed, command, check=True):
    return in_ct(testbed, "pve2", 300, command, check)


def prepare_ct300(testbed):
    """Model, data and a running trainer of the default release in ct300."""
    in_ct300(testbed, "mkdir -p /dev/shm/models/target /workspace/data && "
                      "echo '{}' > /dev/shm/models/target/config.json && "
                      "echo text > /workspace/data/c.txt")
    testbed.playbook(REDEPLOY, "-l", "ct300")


def test_ct_stopped_between_push_and_launch(testbed, tmp_path):
    prepare_ct300(testbed)
    current = in_ct300(testbed, "readlink /opt/dflash/current").stdout
    src = tmp_path / "src"
    src.mkdir()
    (src / "train_dflash_pipeline.py").write_text(open(TRAINER).read() + "\n# v-fault\n")
    testbed.playbook(REDEPLOY, "-l", "ct300", "--tags", "push", "-e", f"trainer_code_src={src}")
    testbed.ssh("pve2", "pct stop 300", check=True)
    try:
        res = testbed.playbook(REDEPLOY, "-l", "ct300", "-e", f"trainer_code_src={src}",
                               check=False)
        assert res.returncode != 0
        assert "CT 300 on pve2 is stopped (pct status: stopped)" in res.stdout
    finally:
        testbed.ssh("pve2", "pct start 300", check=True)
    # no half state: current untouched, no temporary release left
    assert in_ct300(testbed, "readlink /opt/dflash/current").stdout == current
    assert ".tmp-" not in in_ct300(testbed, "ls -a /opt/dflash/releases").stdout
    # the restart wiped /dev/shm: the rerun says so, then converges once the model is back
    res = testbed.playbook(REDEPLOY, "-l", "ct300", "-e", f"trainer_code_src={src}", check=False)
    assert res.returncode != 0 and "wiped when the CT restarts" in res.stdout
    prepare_ct300(testbed)
    res = testbed.playbook(REDEPLOY, "-l", "ct300", "-e", f"trainer_code_src={src}")
    assert "failed=0" in res.stdout
    assert in_ct300(testbed, "readlink /opt/dflash/current").stdout != current


def test_unreachable_node_fails_its_cts_only(testbed, tmp_path):
    inventory = tmp_path / "inventory"
    shutil.copytree(TESTBED_INVENTORY, inventory)
    hosts = (inventory / "hosts.yml").read_text()
    hosts = hosts.replace("        pve2:\n", "        pve9:\n          ansible_host: 127.77.0.9\n        pve2:\n")
    hosts = hosts.replace("        ct300:\n", "        ct900:\n          pve_node: pve9\n"
                                               "          ansible_pct_vmid: 900\n        ct300:\n")
    (inventory / "hosts.yml").write_text(hosts)
    prepare_ct300(testbed)
    res = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(inventory), REDEPLOY,
                          "-l", "ct300,ct900", "-e", "redeploy_serial=2"], cwd=REPO, env=tool_env(),
                         capture_output=True, text=True, check=False)
    assert res.returncode != 0
    assert "ct900" in res.stdout and "UNREACHABLE" in res.stdout
    # seen once under five workers without these words, its output cut short: the ssh failure
    # shown whole, to tell next time what it said
    assert "Connection refused" in res.stdout, "\n".join(
        line for line in res.stdout.splitlines() if "127.77.0.9" in line or "ct900" in line)
    recap = {line.split()[0]: line for line in res.stdout.splitlines() if " : ok=" in line}
    assert "unreachable=1" in recap["ct900"] and "failed=0" in recap["ct300"]
    assert "unreachable=0" in recap["ct300"]


@pytest.mark.parametrize("extra,message", [
    ({"ansible_pct_vmid": 999}, "Configuration file 'nodes/pve2/lxc/999.conf' does not exist"),
    ({"dflash_target_gpus": [0, 0]}, "dflash_target_gpus: GPU 0 is listed twice"),
    ({"dflash_data_dir": "relative/data"}, "dflash_data_dir: must be an absolute path"),
    ({"dflash_lr": "fast"}, "dflash_lr: expected a number"),
    # a role variable of the last phase is checked before the first one touches anything
    ({"trainer_launch_health_timeout": "soon"}, "argument 'trainer_launch_health_timeout' is of type str"),
])
def test_bad_inputs_fail_clearly_and_touch_nothing(testbed, extra, message):
    pushes = sum(c["argv"][0] == "push" for c in testbed.pct_invocations("pve2"))
    res = testbed.playbook(REDEPLOY, "-l", "ct301", "-e", json.dumps(extra), check=False)
    assert res.returncode != 0 and message in res.stdout
    assert sum(c["argv"][0] == "push" for c in testbed.pct_invocations("pve2")) == pushes
    assert not task_ran(res.stdout, "Stop the trainer in stages")
    # a CT that answered gets its summary; an unknown vmid leaves the host unreachable, which
    # Ansible takes out of the play (its recap and the error above say it)
    if "unreachable=1" in res.stdout:
        assert extra == {"ansible_pct_vmid": 999}
    else:
        assert re.search(r"ct301: [^']*not\s+stopped,\s+not\s+launched", res.stdout)


def test_host_matching_nothing_is_an_error():
    res = subprocess.run(["make", "restart", "HOST=no-such-ct"], cwd=REPO, env=tool_env(),
                         capture_output=True, text=True, check=False)
    assert res.returncode != 0
    inventory = os.environ.get("INVENTORY", "inventory/testbed")  # an xdist worker's own testbed
    assert f"HOST=no-such-ct selects no trainer CT (group dflash_trainers) of {inventory}" in res.stderr


def test_full_checkpoint_filesystem_is_reported_and_nothing_deleted(ct, tmp_path):
    ct.sh(f"mount -t tmpfs -o size=512k tmpfs {OUT}")
    try:
        ct.launch()  # a first run stops cleanly: its checkpoint is the previous one
        first = stop(tmp_path / "first", checkpoint_dir=OUT,
                     require_checkpoint=True, ladder=FAST_LADDER)
        previous = first["checkpoint"]["new"]
        before = ct.sh(f"sha256sum {previous}/*").stdout
        ct.launch(extra="--resume")  # from the previous checkpoint: the log then runs past its step
        ct.sh(f"dd if=/dev/zero of={OUT}/filler bs=4k 2>/dev/null || true")  # the disk is full
        result = stop(tmp_path, expect_failure=True, checkpoint_dir=OUT, log_file="/workspace/train.log",
                      ladder=FAST_LADDER)  # fails by default
        assert "no new sound checkpoint in /workspace/ck: none completed during the stop" in result["msg"]
        assert "No trainer is running" in result["msg"] and "Free space there: 0.00 GiB" in result["msg"]
        assert re.search(r"the log is at step \d+: \d+( to \d+)? steps not in a checkpoint", result["msg"])
        assert "Temporary files left (not deleted): .tmp-step_" in result["msg"]
        assert result["stopped"] is True and ct.trainer_pids() == []
        assert "No space left on device" in ct.sh("cat /workspace/train.log").stdout
        assert result["checkpoint"]["newest"] == previous
        assert ct.sh(f"sha256sum {previous}/*").stdout == before  # the previous one intact
        assert ct.sh(f"test -f {OUT}/filler", check=False).returncode == 0  # nothing deleted
    finally:
        ct.clean()
        ct.sh(f"umount {OUT}", check=False)


# -- the rollout's failure paths (ct300 and friends) -------------------------------------------

def source(tmp_path, name, edit):
    return trainer_source(tmp_path / name, edit)


def links(testbed):
    return in_ct300(testbed, "readlink /opt/dflash/current /opt/dflash/previous", check=False).stdout.split()


def test_a_traceback_on_the_first_progress_line_fails_health_and_the_old_release_runs_again(testbed, tmp_path):
    prepare_ct300(testbed)
    before, old = links(testbed), in_ct300(testbed, "cut -d' ' -f1 /run/dflash/trainer.pid").stdout.strip()
    # the new release crashes while it formats its first progress line (the traceback shows that
    # source line, "tok/s" in it) and stays alive 8 s as CUDA/NCCL would while they tear down
    src = source(tmp_path, "traceback", lambda t: t.replace(
        'crash_in_progress = env.get("DFLASH_TEST_CRASH_IN_PROGRESS_LINE") == "1"', "crash_in_progress = True").replace(
        'time.sleep(float(os.environ.get("DFLASH_TEST_TEARDOWN_SECONDS", "0")))', "time.sleep(8)"))
    res = testbed.playbook(REDEPLOY, "-l", "ct300", "-e", f"trainer_code_src={src}", check=False)
    out = " ".join(res.stdout.split())
    assert res.returncode != 0
    assert "launch failed: the trainer (PID" in out and "printed a Python traceback" in out
    assert "ZeroDivisionError" in out
    # the failed trainer was stopped (staged), the releases of before are back exactly, the old
    # release runs again from the checkpoint
    assert links(testbed) == before
    assert re.search(r"launch failed, rolled back to \w+: PID \d+ running again", out)
    now = in_ct300(testbed, "cut -d' ' -f1 /run/dflash/trainer.pid").stdout.strip()
    assert now != old and in_ct300(testbed, f"test -d /proc/{now}", check=False).returncode == 0
    assert "ZeroDivisionError" not in in_ct300(testbed, "cat /workspace/logs/train.log").stdout
    assert "ZeroDivisionError" in in_ct300(testbed, "cat /workspace/logs/train.log.failed").stdout


# the run of before, made unable to start: its last healthy launch's own settings (the CT's run.json)
# now crash at start, as a changed environment would make them
BREAK_THE_RUN_OF_BEFORE = (
    "python3 -c \"import json; p = '/var/lib/dflash/lifecycle/run.json'; s = json.load(open(p)); "
    "head, rest = s['launch']['wrapper_script'].split(chr(10), 1); "
    "s['launch']['wrapper_script'] = head + chr(10) + 'export DFLASH_TEST_CRASH_AT_START=1' + chr(10) + rest; "
    "json.dump(s, open(p, 'w'))\"")


def test_a_failed_launch_and_a_failed_rollback_fail_with_both_causes(testbed, tmp_path):
    prepare_ct300(testbed)
    before = links(testbed)
    good_log = in_ct300(testbed, "cat /workspace/logs/train.log").stdout
    assert "tok/s" in good_log
    in_ct300(testbed, BREAK_THE_RUN_OF_BEFORE)
    src = source(tmp_path, "v-both", lambda t: t + "\n# v-both\n")
    # every launch crashes at start: the new release's (this job's settings) and the rescue's relaunch of the
    # old one (its own settings, broken above)
    res = testbed.playbook(REDEPLOY, "-l", "ct300", "-e", f"trainer_code_src={src}",
                           "-e", json.dumps({"dflash_env": {"DFLASH_TEST_CRASH_AT_START": "1"}}), check=False)
    out = " ".join(res.stdout.split())
    assert res.returncode != 0
    assert re.search(r"launch failed: the trainer \(PID \d+\) (printed a Python traceback and )?exited with status 1", out), out
    assert "rollback failed: the trainer (PID" in out
    assert re.search(r"\(on the settings of its healthy launch at [0-9-]+ [0-9:]+ UTC \(release \w+\); this job'{1,2}s "
                     r"differed in wrapper_script\)", out), out
    assert "NO TRAINER IS RUNNING in this CT; newest checkpoint /workspace/checkpoints/step_" in out
    assert "no command line: not launched" not in out and "PID None" not in out
    assert in_ct300(testbed, "pgrep -f 'train_dflash_pipeline[.]py'", check=False).stdout == ""
    # the release that failed is neither current nor previous, and a rollback refuses it
    assert links(testbed) == before
    failures = json.loads(in_ct300(testbed, "cat /opt/dflash/launch-failures.json").stdout)
    assert in_ct300(testbed, "ls -t /opt/dflash/releases").stdout.split()[0] in failures  # the new one
    # the last good run's log is where it was, not rotated away by the failed attempts
    log = in_ct300(testbed, "cat /workspace/logs/train.log").stdout
    assert log.startswith(good_log) and "KeyboardInterrupt at step" in log and "crash at start" not in log
    prepare_ct300(testbed)  # a healthy launch of it clears the record


def test_a_setting_that_fails_the_launch_leaves_the_run_of_before_on_its_own_settings(testbed):
    """ct300 runs alone and its release is installed: the preflight's call stops the trainer and
    launches with this job's settings (one round trip), which pass every check and crash at start.
    The rescue brings the run of before back as it was - its release and its last healthy launch's own
    settings, resuming from the stop's checkpoint - and the report says which settings, and what
    this job changed; the lock is given back."""
    prepare_ct300(testbed)
    before = links(testbed)
    res = testbed.playbook(REDEPLOY, "-l", "ct300", "-e", json.dumps({"dflash_env": {"DFLASH_TEST_CRASH_AT_START": "1"}}),
                           check=False)
    out = " ".join(res.stdout.split())
    assert res.returncode != 0
    preflight = next(block for block in res.stdout.split("\nTASK [")[1:]
                     if block.startswith("trainer_preflight : Check GPUs"))
    assert "fatal: [ct300]" in preflight and "exited with status 1" in preflight, preflight
    found = re.search(r"ct300: release \w+ \(installed already\), stopped by SIGINT in [0-9.]+s, checkpoint "
                      r"(/workspace/checkpoints/step_\d+) \(step_dirs\) \(0 steps lost\), launch failed, rolled back to "
                      r"\w+: PID (\d+) running again \(on the settings of its healthy launch at [0-9-]+ "
                      r"[0-9:]+ UTC \(release \w+\); this job'{1,2}s differed in wrapper_script\)", out)
    assert found, out
    pid = found.group(2)
    assert in_ct300(testbed, "pgrep -f 'train_dflash_pipeline[.]py'", check=False).stdout.split() == [pid]
    assert "DFLASH_TEST_CRASH_AT_START" not in in_ct300(testbed, f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
    assert f"resumed from {found.group(1)}" in in_ct300(testbed, "cat /workspace/logs/train.log").stdout
    assert links(testbed) == before
    prepare_ct300(testbed)  # the next job takes the CT: the lock was given back


def test_a_full_disk_at_the_stop_fails_the_redeploy_and_states_the_loss(testbed):
    prepare_ct300(testbed)
    out_dir = "/workspace/ck-full"
    in_ct300(testbed, f"{END_SUPERVISORS}; kill -KILL $(cut -d' ' -f1 /run/dflash/trainer.pid); mkdir -p {out_dir} && "
                      f"mount -t tmpfs -o size=512k tmpfs {out_dir}")
    try:
        # a run that checkpoints there only when it is stopped (no periodic saves to race with)
        override = ["-e", json.dumps({"dflash_output_dir": out_dir, "dflash_extra_args": ["--save-interval", "1000000"],
                                      "trainer_run_min_free_gb": 0})]
        testbed.playbook(REDEPLOY, "-l", "ct300", *override)
        testbed.playbook(REDEPLOY, "-l", "ct300", *override)  # its stop writes the checkpoint it resumes from
        assert "step_" in in_ct300(testbed, f"ls {out_dir}").stdout
        in_ct300(testbed, f"dd if=/dev/zero of={out_dir}/filler bs=4k 2>/dev/null || true")  # the disk is full
        res = testbed.playbook(REDEPLOY, "-l", "ct300", *override, check=False)
        out = " ".join(res.stdout.split())
        assert res.returncode != 0, out
        assert f"stop failed: the trainer stopped, but no new sound checkpoint in {out_dir}" in out, out
        assert re.search(r"the log is at step \d+: \d+( to \d+)? steps not in a checkpoint", out), out
        assert "Free space there: 0.00 GiB" in out and "Temporary files left (not deleted): .tmp-step_" in out, out
        assert "NO TRAINER IS RUNNING in this CT" in out, out
        # said first, with when and the command that starts it again
        assert re.search(r"ct300 is DOWN since \d{4}-\d\d-\d\d [0-9:]{8} UTC, when this job stopped it: "
                         r"`make start HOST=ct300` starts it again\. ct300: release", out), out
        # the launch's call stopped first and started nothing; no rescue relaunched anything
        assert "the stop failed, nothing was started" in out, out
        assert not task_ran(res.stdout, "Relaunch it from the newest checkpoint"), out
        assert in_ct300(testbed, "pgrep -f 'train_dflash_pipeline[.]py'", check=False).stdout == "", out
        assert ".tmp-step_" in in_ct300(testbed, f"ls -a {out_dir}").stdout  # reported, never deleted
    finally:
        in_ct300(testbed, f"umount {out_dir}; rmdir {out_dir}", check=False)
    prepare_ct300(testbed)


def test_a_failed_ct_stops_the_rollout_after_its_batch(testbed, tmp_path):
    inventory = tmp_path / "inventory"
    shutil.copytree(TESTBED_INVENTORY, inventory)
    hosts = (inventory / "hosts.yml").read_text()
    # ct201's trainer ignores SIGINT and its stop refuses (no_graceful: fail)
    hosts = hosts.replace("          ansible_pct_vmid: 201\n",
                          "          ansible_pct_vmid: 201\n          trainer_stop_no_graceful: fail\n")
    (inventory / "hosts.yml").write_text(hosts)
    testbed.playbook(SEED, "-e", "seed_hosts=ct200,ct201")
    prepare_ct300(testbed)
    in201 = functools.partial(in_ct, testbed, "pve1", 201)
    in201(END_RUNS, check=False)  # the runs' supervisors first
    in201("rm -f /run/dflash/trainer.pid; cd /workspace && nohup python3 -u /root/train_dflash_pipeline.py "
          "--target-model /dev/shm/models/target --data-dir /workspace/data --output-dir /workspace/checkpoints "
          "--target-gpus 0,1 --drafter-gpus 2 > /workspace/logs/legacy.log 2>&1 &")
    untouched = in_ct300(testbed, "cut -d' ' -f1 /run/dflash/trainer.pid").stdout.strip()
    res = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(inventory), REDEPLOY,
                          "-l", "ct200,ct201,ct300", "-e", "redeploy_serial=2"], cwd=REPO, env=tool_env(),
                         capture_output=True, text=True, check=False)
    try:
        assert res.returncode != 0
        recap = {line.split()[0]: line for line in res.stdout.splitlines() if " : ok=" in line}
        assert "failed=1" in recap["ct201"] and "ct300" not in recap, res.stdout
        out = " ".join(res.stdout.split())
        assert "stop failed" in out and "SIGINT is ignored by PID" in out
        assert in_ct300(testbed, "cut -d' ' -f1 /run/dflash/trainer.pid").stdout.strip() == untouched
    finally:
        in201(END_RUNS, check=False)  # the runs' supervisors first
