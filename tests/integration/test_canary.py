"""The throughput canary on the testbed: every redeploy compares the run it replaced with the run
it started, and a slower release is reported, fails its CT or is rolled back."""

import json
import os
import re
import shlex
import shutil
import subprocess

import pytest

from testlib import BIN, END_RUNS, REPO, TESTBED_INVENTORY, tool_env, trainer_source

REDEPLOY = os.path.join(REPO, "redeploy.yml")
SEED = os.path.join(REPO, "playbooks", "testbed_seed.yml")
CTS = {"ct200": ("pve1", 200), "ct201": ("pve1", 201)}
# progress lines every 5 steps (0.25 s), the canary over 3 of them after 1 of warm-up
FAST = {"dflash_profile_interval": 5, "trainer_run_throughput_lines": 3, "trainer_run_throughput_warmup_lines": 1}


def in_ct(testbed, host, command, check=True):
    node, vmid = CTS[host]
    return testbed.in_ct(node, vmid, command, check=check)


def source(tmp_path, name, slowdown):
    return trainer_source(tmp_path / name,
                          lambda t: t.replace("RELEASE_SLOWDOWN = 1.0", f"RELEASE_SLOWDOWN = {slowdown}"))


def redeploy(testbed, hosts, *extra, inventory=None, **extra_vars):
    args = [os.path.join(BIN, "ansible-playbook"), REDEPLOY, "-l", hosts, "-e", json.dumps(dict(FAST, **extra_vars)), *extra]
    if inventory:
        args[1:1] = ["-i", inventory]
    res = subprocess.run(args, cwd=REPO, env=tool_env(), capture_output=True, text=True, check=False)
    # the callback folds long lines, and doubles a quote inside a quoted one
    res.out = " ".join(res.stdout.split()).replace("''", "'")
    return res


def current(testbed, host):
    return in_ct(testbed, host, "readlink /opt/dflash/current").stdout.strip().split("/")[-1]


def pid(testbed, host):
    return in_ct(testbed, host, "cut -d' ' -f1 /run/dflash/trainer.pid").stdout.strip()


@pytest.fixture(scope="module")
def running(testbed, tmp_path_factory):
    """ct200 and ct201 run the example trainer's default release, logging every 5 steps."""
    for host in CTS:
        in_ct(testbed, host, END_RUNS, check=False)  # the runs' supervisors first
        in_ct(testbed, host, "rm -rf /workspace/checkpoints")
    testbed.playbook(SEED, "-e", "seed_hosts=ct200,ct201")
    res = redeploy(testbed, "ct200,ct201", "-e", "redeploy_serial=2")
    assert res.returncode == 0, res.stdout
    return testbed


def test_an_equal_release_passes_the_canary(running):
    # a median over 12 lines (3 s): this test runs while sanity and the GPU check load both CPUs,
    # whose bursts move a 3-line window of the same release by more than the threshold
    res = redeploy(running, "ct201", redeploy_canary_policy="fail", trainer_run_throughput_lines=12)
    assert res.returncode == 0, res.stdout
    figures = re.search(r"canary: tok/s ([0-9.]+) -> ([0-9.]+) \(([-+][0-9.]+)%, threshold -5.0%\)", res.out)
    assert figures, res.out
    assert abs(float(figures.group(3))) < 5 and "REGRESSION" not in res.out


def test_a_slower_release_under_rollback_runs_the_old_one_again(running, tmp_path):
    old, old_pid = current(running, "ct201"), pid(running, "ct201")
    res = redeploy(running, "ct201", redeploy_canary_policy="rollback", trainer_code_src=source(tmp_path, "slow", 1.6))
    assert res.returncode != 0
    figures = re.search(r"throughput regression: tok/s ([0-9.]+) -> ([0-9.]+) \((-[0-9.]+)%, threshold -5.0%\): "
                        r"REGRESSION, rollback; target \+[0-9.]+ ms", res.out)
    assert figures and float(figures.group(2)) < float(figures.group(1)), res.out
    assert f"throughput regression, rolled back to {old}: PID" in res.out
    # the old release runs again, resumed from the checkpoint the rejected run wrote
    assert current(running, "ct201") == old and pid(running, "ct201") != old_pid
    assert re.search(r"resumed from /workspace/checkpoints/step_\d+", in_ct(running, "ct201", "cat /workspace/logs/train.log").stdout)
    dispatched = json.loads(in_ct(running, "ct201", "cat /run/dflash/launch.json").stdout)
    assert dispatched["release"] is None  # the relaunch ran what current points to: the old release


def test_a_slower_release_under_fail_stops_the_rollout_after_the_canary_batch(running, tmp_path):
    inventory = tmp_path / "inventory"
    shutil.copytree(TESTBED_INVENTORY, inventory)
    untouched = pid(running, "ct201")
    res = redeploy(running, "ct200,ct201", inventory=str(inventory), redeploy_canary_policy="fail",
                   redeploy_serial=1, trainer_code_src=source(tmp_path, "slow", 1.6))
    assert res.returncode != 0
    recap = {line.split()[0]: line for line in res.stdout.splitlines() if " : ok=" in line}
    assert "failed=1" in recap["ct200"] and "ct201" not in recap, res.stdout
    assert "throughput regression: tok/s" in res.out and "REGRESSION, fail" in res.out
    # the CT failed, its new run is left running; the next batch was never touched
    assert in_ct(running, "ct200", f"test -d /proc/{pid(running, 'ct200')}", check=False).returncode == 0
    assert pid(running, "ct201") == untouched


def test_the_log_the_running_trainer_writes_is_read_even_when_moved(running):
    # log_file moved away under the running trainer: it goes on writing the same file, there
    in_ct(running, "ct201", "mv /workspace/logs/train.log /workspace/logs/moved.log")
    # the figures of one run on both sides pass; the 3 lines each side read vary by 10% when the tests
    # load both CPUs, where another run's figures (a wrong log) differ many times over
    res = redeploy(running, "ct201", redeploy_canary_policy="fail", redeploy_canary_threshold=-25)
    assert res.returncode == 0, res.stdout
    assert re.search(r"canary: tok/s [0-9.]+ -> [0-9.]+ \([-+][0-9.]+%, threshold -25.0%\).*; before: read "
                     r"/workspace/logs/moved.log \(stdout\), not log_file /workspace/logs/train.log", res.out), res.out


def hand_start(testbed, host, output):
    """The project's run stopped with its checkpoint and started again by hand from the same
    command line, logging every 10 steps, its output to output: `setsid -f ... > output`."""
    trainer = pid(testbed, host)
    argv = in_ct(testbed, host, f"tr '\\0' ' ' < /proc/{trainer}/cmdline").stdout.split()
    argv[argv.index("--profile-interval") + 1] = "10"
    in_ct(testbed, host, f"kill -INT {trainer}; while test -d /proc/{trainer}; do sleep 0.1; done")
    in_ct(testbed, host, f"cd /workspace && setsid -f {shlex.join(argv)} > {output} 2>&1 < /dev/null")


def test_a_trainer_started_by_hand_is_judged_by_its_own_log(running):
    """nohup ... > /root/train.log, with an older run's log at log_file (step 99999, 1.0 tok/s,
    written an hour ago): the stop counts from the trainer's own log (0 steps lost after its
    interrupt checkpoint) and the canary compares against its own figures. With its output
    thrown away, no log of this run is known: unknown, and said why, never the older run's."""
    stale = "2026-01-01 00:00:00 step 99999 epoch 0 loss 1.0000 tok/s 1.0 | data 1.00ms target 1.00ms"
    older_run = f"echo '{stale}' > /workspace/logs/train.log && touch -d '1 hour ago' /workspace/logs/train.log"
    hand_start(running, "ct200", "/root/train.log")
    in_ct(running, "ct200", older_run)
    in_ct(running, "ct200", "until [ $(grep -c 'tok/s' /root/train.log) -ge 5 ]; do sleep 0.1; done")
    res = redeploy(running, "ct200", redeploy_canary_policy="fail")
    assert res.returncode == 0, res.stdout
    assert re.search(r"stopped by SIGINT in [0-9.]+s, checkpoint \S+/step_\d+ \(step_dirs\) \(0 steps lost\)", res.out), res.out
    figures = re.search(r"canary: tok/s ([0-9.]+) -> ([0-9.]+) \(([-+][0-9.]+)%", res.out)
    assert figures and float(figures.group(1)) > 100, res.out  # this run's figure, not the older run's 1.0
    assert "before: read /root/train.log (stdout), not log_file /workspace/logs/train.log" in res.out

    hand_start(running, "ct200", "/dev/null")
    in_ct(running, "ct200", older_run)
    res = redeploy(running, "ct200", redeploy_canary_policy="fail")
    assert res.returncode == 0, res.stdout
    assert re.search(r"canary: tok/s unknown -> [0-9.]+ \(not compared: the log of the old run had no progress line "
                     r"\(no log of this run: PID \d+ holds no regular file open for writing \(its stdout is /dev/null, its stderr is "
                     r"/dev/null\); "
                     r"/workspace/logs/train.log was last written before the trainer started", res.out), res.out


def test_a_check_run_reports_no_canary_of_a_run_it_did_not_start(running):
    res = redeploy(running, "ct201", "--check")
    assert res.returncode == 0, res.stdout
    assert re.search(r"canary: tok/s [0-9.]+ now, of the running trainer; compared after a real launch", res.out), res.out
    assert "new run" not in res.out


def log_lines(testbed, host):
    """The progress lines of the run's log and the one before it."""
    logs = "\n".join(in_ct(testbed, host, f"cat /workspace/logs/train.log{s}").stdout for s in (".1", ""))
    return len(re.findall(r"\bstep \d+ .*tok/s", logs))


def throughput_chart(testbed, host):
    res = subprocess.run([os.path.join(BIN, "ansible-playbook"), os.path.join(REPO, "playbooks", "throughput.yml"),
                          "-l", host], cwd=REPO, env=tool_env(), capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout
    return res.stdout


def test_the_chart_of_a_young_run_has_one_column_per_line_and_marks_the_redeploy(running):
    """Right after a redeploy: one column per progress line of the new run and the one it
    replaced (LOG.1), a mark where the new run began, each run's release, stretch and time."""
    res = redeploy(running, "ct200")
    assert res.returncode == 0, res.stdout
    before = log_lines(running, "ct200")
    out = throughput_chart(running, "ct200")
    after = log_lines(running, "ct200")  # the trainer goes on logging
    shown = int(re.search(r"tok/s, steps \d+-\d+ \((\d+) progress lines, over \d+m\d\ds\)", out).group(1))
    assert before <= shown <= after, (before, shown, after)
    (spark,) = re.findall(r"^\s*- '?([▁▂▃▄▅▆▇█]+)'?$", out, re.M)
    assert len(spark) == min(shown, 60), out
    assert "^ a redeploy" in out
    release = current(running, "ct200")
    assert re.search(rf"release {release}: steps \d+-\d+, over \d+m\d\ds, median [0-9.]+ tok/s", out), out
