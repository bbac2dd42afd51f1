"""redeploy.yml end to end on the testbed: rolling over 2 nodes x 2 CTs, the AWX path through
ansible-runner, the failure paths, the lock, check mode and `make restart HOST=...`."""

import json
import os
import re
import shlex
import subprocess
import time

import ansible_runner
import pytest

from testlib import BIN, END_RUNS, REPO, TESTBED_INVENTORY, TRAINER, task_ran, tool_env, trainer_source


CTS = {"ct200": ("pve1", "200"), "ct201": ("pve1", "201"),
       "ct300": ("pve2", "300"), "ct301": ("pve2", "301")}
SEED = os.path.join(REPO, "playbooks", "testbed_seed.yml")
REDEPLOY = os.path.join(REPO, "redeploy.yml")


def in_ct(testbed, host, command, check=True):
    node, vmid = CTS[host]
    return testbed.in_ct(node, vmid, command, check=check)


def trainer_pids(testbed, host):
    return in_ct(testbed, host, "pgrep -f train_dflash_pipeline[.]py", check=False).stdout.split()


def source(tmp_path, name, edit=None):
    """A copy of the example trainer, changed by edit(text) -> text."""
    return trainer_source(tmp_path / name, edit)


def runner(tmp_path, limit, extravars, check=False, name="awx"):
    """redeploy.yml as AWX runs it: private_data_dir, survey answers + awx_* as extravars."""
    private = tmp_path / name
    private.mkdir()
    run = ansible_runner.run(
        private_data_dir=str(private), playbook=REDEPLOY, project_dir=REPO,
        inventory=TESTBED_INVENTORY, limit=limit,
        extravars=dict({"awx_job_id": 42, "awx_user_name": "admin"}, **extravars),
        cmdline="--check" if check else None, quiet=True)
    stats = next(e for e in run.events if e["event"] == "playbook_on_stats")["event_data"]
    return run, stats


def pct_pushes(testbed):
    """The release archives pushed (py-spy's push, once per CT and version, is the preflight's)."""
    return sum(1 for node in ("pve1", "pve2") for c in testbed.pct_invocations(node)
               if c["argv"][0] == "push" and c["argv"][3].endswith(".tar.gz"))


@pytest.fixture(scope="module")
def seeded(testbed):
    """Every CT runs the seeded (legacy-path) trainer, as before the first redeploy."""
    for host in CTS:  # from scratch: no trainer, checkpoint or release left by other tests
        in_ct(testbed, host, END_RUNS, check=False)
        in_ct(testbed, host, "rm -rf /workspace/checkpoints /opt/dflash /root/train_dflash_pipeline.py*")
    testbed.playbook(SEED, "-e", "seed_hosts=dflash_trainers")
    return testbed


def test_awx_rolling_redeploy_of_2_nodes_x_2_cts_with_a_code_change(seeded, tmp_path):
    before = {host: trainer_pids(seeded, host) for host in CTS}
    assert all(len(p) == 1 for p in before.values()), before
    src = source(tmp_path, "v2", lambda t: t + "\n# release v2\n")
    pushes = pct_pushes(seeded)
    run, stats = runner(tmp_path, "dflash_trainers", {
        "trainer_code_src": src, "trainer_stop_sigint_wait": 60, "dflash_resume": "true",
        "redeploy_serial": 4, "trainer_stop_require_checkpoint": True})
    assert run.status == "successful", run.stdout.read()
    assert sorted(stats["ok"]) == sorted(CTS) and not stats["failures"] and not stats["dark"]
    assert pct_pushes(seeded) - pushes == 4  # one archive per CT
    summary = stats["artifact_data"]["dflash_redeploy"]
    assert sorted(summary) == sorted(CTS)
    releases = {s["release"] for s in summary.values()}
    assert len(releases) == 1
    (release,) = releases
    for host, entry in summary.items():
        assert entry["stopped_by"]["signal"] == "SIGINT", entry
        assert entry["checkpoint"].startswith("/workspace/checkpoints/step_")
        assert str(entry["pid"]) not in before[host] and trainer_pids(seeded, host) == [str(entry["pid"])]
        assert in_ct(seeded, host, "readlink /opt/dflash/current").stdout.strip() == f"releases/{release}"
        args = in_ct(seeded, host, f"ps -o args= -p {entry['pid']}").stdout.strip()
        assert args == entry["command_line"]
        assert "--resume" in args and "/opt/dflash/current/train_dflash_pipeline.py" in args
    # a release to push: the preflight's call launched nothing, and said why
    preflights = [e["event_data"]["res"] for e in run.events if e["event"] == "runner_on_ok"
                  and e["event_data"]["task"] == "Check GPUs, model, data, disk and the installed trainer in the CT"]
    assert len(preflights) == 4
    assert all(p["launch"] is None and p["launch_deferred"] == f"release {release} is to be pushed first"
               for p in preflights), preflights
    # the batch ran in parallel: the four launches overlap in time
    starts = [e for e in run.events if e["event"] == "runner_on_start"
              and e["event_data"]["task"] == "Start the trainer and wait until it is healthy"]
    assert len({e["event_data"]["host"] for e in starts}) == 4


def test_awx_check_run_changes_nothing(seeded, tmp_path):
    pids = {host: trainer_pids(seeded, host) for host in ("ct201", "ct300")}
    currents = {h: in_ct(seeded, h, "readlink /opt/dflash/current").stdout for h in pids}
    pushes = pct_pushes(seeded)
    src = source(tmp_path, "v3", lambda t: t + "\n# release v3\n")
    run, stats = runner(tmp_path, "ct201,ct300", {"trainer_code_src": src}, check=True)
    assert run.status == "successful", run.stdout.read()
    assert sorted(stats["ok"]) == ["ct201", "ct300"]
    assert {h: trainer_pids(seeded, h) for h in pids} == pids
    assert {h: in_ct(seeded, h, "readlink /opt/dflash/current").stdout for h in pids} == currents
    assert pct_pushes(seeded) == pushes
    shown = "".join(json.dumps(e["event_data"].get("res", {})) for e in run.events)
    assert "--noise-type uniform" in shown and "would stop PID" in shown


def test_no_change_redeploy_stops_and_relaunches_without_a_push(seeded):
    seeded.playbook(REDEPLOY, "-l", "ct201")  # the default source is now the current release
    old = trainer_pids(seeded, "ct201")
    pushes = pct_pushes(seeded)
    calls = len(seeded.pct_invocations("pve1"))
    res = seeded.playbook(REDEPLOY, "-l", "ct201")
    job_calls = seeded.pct_invocations("pve1")[calls:]
    assert "failed=0" in res.stdout
    assert pct_pushes(seeded) == pushes
    new = trainer_pids(seeded, "ct201")
    assert len(new) == 1 and new != old
    # a CT that runs alone, nothing to push or stage: the preflight's call stops and launches, no
    # task of their own; one pct call in all
    assert not task_ran(res.stdout, "Stop the trainer in stages")
    assert not task_ran(res.stdout, "Start the trainer and wait until it is healthy")
    assert re.search(r"ct201: release \w+ \(installed already\), stopped by SIGINT in [0-9.]+s, checkpoint "
                     r"\S+ \(step_dirs\) \(0 steps lost\), PID \d+", " ".join(res.stdout.split())), res.stdout
    assert len(job_calls) == 1, job_calls


def test_a_modules_payload_built_by_one_run_is_not_built_again_by_the_next(seeded):
    """ansible-core builds a module's AnsiballZ payload once per run, 0.1-0.2 s of controller CPU on a
    redeploy's critical path; the collection keeps it for the next run (plugin_utils/payload_cache.py).
    Seen in ansible-core's own debug lines: the second run finds it and creates none."""
    args = json.dumps({"checkpoint_dir": "/workspace/checkpoints", "log_file": "/workspace/logs/train.log",
                       "pidfile": "/run/dflash/trainer.pid"})
    outputs = []
    for _run in range(2):
        res = subprocess.run([os.path.join(BIN, "ansible"), "ct201", "-m", "dflash.lifecycle.trainer_info", "-a", args],
                             cwd=REPO, env=dict(tool_env(), ANSIBLE_DEBUG="1"), capture_output=True, text=True, check=False)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        outputs.append(res.stdout + res.stderr)
    assert "ANSIBALLZ: Creating module" not in outputs[1]
    assert re.search(r"ANSIBALLZ: using cached module: \S+/ansible_collections\.dflash\.lifecycle\.plugins\.modules"
                     r"\.trainer_info-", outputs[1]), outputs[1][-3000:]


def test_compile_error_leaves_the_running_trainer_alone(seeded, tmp_path):
    old = trainer_pids(seeded, "ct201")
    current = in_ct(seeded, "ct201", "readlink /opt/dflash/current").stdout
    src = source(tmp_path, "broken", lambda t: t.replace("def main(", "def main(:", 1))
    res = seeded.playbook(REDEPLOY, "-l", "ct201", "-e", f"trainer_code_src={src}", check=False)
    assert res.returncode != 0 and "compile gate failed" in res.stdout
    assert trainer_pids(seeded, "ct201") == old
    assert in_ct(seeded, "ct201", "readlink /opt/dflash/current").stdout == current


def test_failed_launch_rolls_back_and_relaunches_the_previous_release(seeded, tmp_path):
    current = in_ct(seeded, "ct201", "readlink /opt/dflash/current").stdout.strip()
    src = source(tmp_path, "crashing",
                 lambda t: t.replace("def main(argv=None):\n",
                                     "def main(argv=None):\n    raise SystemExit('release v4 is broken')\n", 1))
    # dflash_resume false: the rescue resumes all the same, from the checkpoint its stop wrote
    res = seeded.playbook(REDEPLOY, "-l", "ct201", "-e", f"trainer_code_src={src}", "-e", "dflash_resume=false",
                          check=False)
    assert res.returncode != 0
    out = " ".join(res.stdout.split())  # the callback folds long lines
    assert "release v4 is broken" in out
    assert in_ct(seeded, "ct201", "readlink /opt/dflash/current").stdout.strip() == current
    # the failed CT still gets its summary: the release it tried, how the old run stopped and
    # the checkpoint it wrote, the release it returned to and the PID running now
    pid = trainer_pids(seeded, "ct201")
    assert re.search(r"ct201: release \w+ \(new: 1 modified, 0 added, 0 removed\), stopped by SIGINT in [0-9.]+s, "
                     r"checkpoint /workspace/checkpoints/step_\d+ \(step_dirs\) \(0 steps lost\), launch failed, rolled back to "
                     + re.escape(current.split("/")[-1]) + r": PID " + pid[0] + " running again", out), out
    assert re.search(r"launch failed: the trainer \(PID \d+\) .*release v4 is broken", out)
    assert len(pid) == 1
    assert "resumed from /workspace/checkpoints/step_" in in_ct(
        seeded, "ct201", "cat /workspace/logs/train.log").stdout
    # the summary's command line is the one that runs, not the settings' (no --resume)
    assert in_ct(seeded, "ct201", f"ps -o args= -p {pid[0]}").stdout.strip().endswith(" --resume")
    assert re.search(r"--save-interval 500 --resume\b", out), out


def test_resume_auto_resumes_from_the_checkpoint_the_stop_wrote(seeded, tmp_path):
    """A young run with no checkpoint yet: the preflight finds none, the stop's SIGINT writes
    the first one, and the relaunch must resume from it rather than start from scratch."""
    in_ct(seeded, "ct300", END_RUNS, check=False)
    in_ct(seeded, "ct300", "rm -rf /workspace/checkpoints")
    seeded.playbook(SEED, "-e", "seed_hosts=ct300")  # its first periodic checkpoint is 25 s away
    run, stats = runner(tmp_path, "ct300", {"trainer_launch_resume": "auto"})
    assert run.status == "successful", run.stdout.read()
    preflight = next(e["event_data"]["res"] for e in run.events if e["event"] == "runner_on_ok"
                     and e["event_data"]["task"] == "Check GPUs, model, data, disk and the installed trainer in the CT")
    assert preflight["checkpoint_present"] is False  # else this test would prove nothing
    entry = stats["artifact_data"]["dflash_redeploy"]["ct300"]
    assert entry["checkpoint"].startswith("/workspace/checkpoints/step_"), entry
    args = in_ct(seeded, "ct300", f"ps -o args= -p {entry['pid']}").stdout.strip()
    assert args == entry["command_line"] and args.endswith(" --resume"), args
    assert f"resumed from {entry['checkpoint']} at step" in in_ct(
        seeded, "ct300", "cat /workspace/logs/train.log").stdout


def test_concurrent_redeploys_of_one_ct(seeded):
    # the first holds the lock through a 20 s health window: the second's start-up, seconds on
    # a loaded machine, once outlasted the whole of a first redeploy with the default window
    args = [os.path.join(BIN, "ansible-playbook"), REDEPLOY, "-l", "ct301", "-e", "trainer_launch_health_seconds=20"]
    first = subprocess.Popen(args, cwd=REPO, env=tool_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while in_ct(seeded, "ct301", "test -e /run/dflash/redeploy.lock", check=False).returncode:
        if first.poll() is not None or time.monotonic() > deadline:
            first.kill()
            raise AssertionError(f"the first redeploy took no lock within 60 s (exit {first.wait()}):\n"
                                 + first.communicate()[0][-6000:])
        time.sleep(0.1)
    second = seeded.playbook(REDEPLOY, "-l", "ct301", check=False)
    out_first = first.communicate(timeout=300)[0]
    assert first.returncode == 0, out_first
    assert second.returncode != 0
    assert "ct301: the CT is being redeployed by 'root@" in second.stdout.replace("''", "'") and " since " in second.stdout


def test_stale_lock_is_taken_over(seeded):
    stale = json.dumps({"holder": "awx job 7 (bob)", "since": 1, "expires": 2})
    in_ct(seeded, "ct301", f"mkdir -p -m 700 /run/dflash && echo {shlex.quote(stale)} "
                           "> /run/dflash/redeploy.lock")
    pids = trainer_pids(seeded, "ct301")
    res = seeded.playbook(REDEPLOY, "-l", "ct301", "--tags", "push")  # one phase: no stop
    # the preflight, the first task in the CT, took it over and says so as a warning
    assert "took over the expired lock of awx job 7 (bob)" in res.stderr
    assert in_ct(seeded, "ct301", "test -e /run/dflash/redeploy.lock", check=False).returncode == 1
    assert trainer_pids(seeded, "ct301") == pids  # --tags push ran the push phase only
    assert not task_ran(res.stdout, "Stop the trainer in stages")


def test_make_restart_touches_only_that_host(seeded):
    others = {host: trainer_pids(seeded, host) for host in ("ct201", "ct300", "ct301")}
    old = trainer_pids(seeded, "ct200")
    pve2_calls = len(seeded.pct_invocations("pve2"))
    res = subprocess.run(["make", "restart", "HOST=ct200"], cwd=REPO, env=tool_env(),
                         capture_output=True, text=True, check=False, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    # a CT that runs alone goes through no gang task (redeploy.yml's first play)
    headers = re.findall(r"^TASK \[(.*)\]", res.stdout, re.M)
    assert headers and not [h for h in headers if "gang" in h.lower()], headers
    assert len(seeded.pct_invocations("pve2")) == pve2_calls  # ct300/ct301's node untouched
    assert trainer_pids(seeded, "ct200") != old
    assert {host: trainer_pids(seeded, host) for host in others} == others


def test_a_hand_edit_through_the_legacy_path_is_found_and_repaired(seeded, tmp_path):
    """The field's habit: write /root/train_dflash_pipeline.py by hand. It links into the current
    release, so the edit lands there: status and check show the drift, on_drift=fail refuses
    before anything is touched, and a redeploy repairs the release (the edit kept aside)."""
    seeded.playbook(REDEPLOY, "-l", "ct201")  # the default source, installed and running
    release = in_ct(seeded, "ct201", "readlink /opt/dflash/current").stdout.strip().split("/")[-1]
    in_ct(seeded, "ct201", "echo '# edited by hand' >> /root/train_dflash_pipeline.py")
    status = subprocess.run(["make", "status", "HOST=ct201"], cwd=REPO, env=tool_env(), capture_output=True,
                            text=True, check=True).stdout
    assert re.search(rf"drift:\s+{release}:\s+added: \[\]\s+modified:\s+- train_dflash_pipeline.py", status), status
    check = subprocess.run(["make", "check", "HOST=ct201"], cwd=REPO, env=tool_env(), capture_output=True,
                           text=True, check=False).stdout
    assert "drifted in place: 1 modified" in " ".join(check.split())
    old = trainer_pids(seeded, "ct201")
    refused = seeded.playbook(REDEPLOY, "-l", "ct201", "-e", "trainer_preflight_on_drift=fail", check=False)
    assert refused.returncode != 0
    assert f"installed releases changed in place (on_drift=fail): {release}: modified train_dflash_pipeline.py" in refused.stdout
    assert trainer_pids(seeded, "ct201") == old  # refused before anything was touched
    res = seeded.playbook(REDEPLOY, "-l", "ct201")
    assert "failed=0" in res.stdout
    assert f"release {release} (drifted in place: 1 modified, 0 added, 0 removed, reinstalled)" in " ".join(res.stdout.split())
    # the new trainer runs the release's own code again; the edit is kept beside it
    assert trainer_pids(seeded, "ct201") != old
    shipped = subprocess.run(["sha256sum"], stdin=open(TRAINER, "rb"), capture_output=True, check=True).stdout.decode()
    assert in_ct(seeded, "ct201", "sha256sum < /root/train_dflash_pipeline.py").stdout == shipped
    assert "edited by hand" in in_ct(seeded, "ct201", f"cat /opt/dflash/releases/.drifted-{release}-*/train_dflash_pipeline.py").stdout


def make_job(target, host, **extravars):
    args = ["make", target, f"HOST={host}"]
    if extravars:
        args.append("EXTRA=-e " + shlex.quote(json.dumps(extravars)))
    res = subprocess.run(args, cwd=REPO, env=tool_env(), capture_output=True, text=True, check=False, timeout=600)
    res.out = " ".join(res.stdout.split())  # the callback folds long lines
    return res


def test_the_stop_request_stops_a_trainer_in_a_long_c_call_and_a_request_not_taken_falls_back(seeded):
    """The field's case through the stop request: the trainer's main thread sits in a 0.5 s C call
    every step (a SIGINT waits for it to return) and logs every 10 steps. A run that takes
    requests (saves_on auto: it announced it) is stopped by `make restart` through the request,
    no signal sent, with its checkpoint and 0 steps lost; the run that follows announces requests
    but never takes one, and `make stop` falls back to the signal ladder and says so."""
    def run(how):
        return {"trainer_run_saves_on": "auto", "trainer_run_checkpoint_format": "step_dirs",
                "dflash_profile_interval": 10, "trainer_stop_request_ack_timeout": 3,
                "dflash_env": {"PYTHONUNBUFFERED": "1", "DFLASH_TEST_BLOCK_IN_C_SECONDS": "0.5",
                               "DFLASH_TEST_STOP_REQUEST": how}}

    res = make_job("restart", "ct201", **run("take"))
    assert res.returncode == 0, res.stdout[-6000:]
    res = make_job("restart", "ct201", **run("ignore"))
    assert res.returncode == 0, res.stdout[-6000:]
    by_request = re.search(r"ct201: release \w+ \(installed already\), stopped by the stop request \(taken at step "
                           r"(\d+), no signal sent\) in [0-9.]+s, checkpoint (\S+) \(step_dirs\) \(0 steps lost\)", res.out)
    assert by_request and by_request.group(2).endswith(f"/step_{by_request.group(1)}"), res.out
    log = in_ct(seeded, "ct201", "cat /workspace/logs/train.log.1").stdout
    assert f"stop request at step {by_request.group(1)}: checkpoint saved, exiting" in log, log[-2000:]
    assert "KeyboardInterrupt" not in log, log[-2000:]
    res = make_job("stop", "ct201", **run("ignore"))
    assert res.returncode == 0, res.stdout[-6000:]
    assert re.search(r"ok: \[ct201\] => msg: '?stopped PID \d+ at stage 1 \(SIGINT\) in [0-9.]+s; new checkpoint .*"
                     r"the stop request was not taken: no acknowledgement in /workspace/logs/train\.log within 3s "
                     r"\(request_ack_timeout\), and the signal ladder followed", res.out), res.out
    assert trainer_pids(seeded, "ct201") == []


def test_a_long_stop_in_the_preflights_call_shows_its_progress(seeded):
    """ct300 runs alone and its release is installed: its redeploy is one call (the preflight's
    launch), whose stop waits 14 s for the trainer's interrupt checkpoint. Past 10 s the controller
    shows the stop's progress, as it does for a stop task of its own."""
    slow = {"dflash_env": {"DFLASH_TEST_SLOW_CHECKPOINT_SECONDS": "14", "DFLASH_TEST_SLOW_SAVES": "interrupt"}}
    seeded.playbook(REDEPLOY, "-l", "ct300", "-e", json.dumps(slow))  # the run that saves slowly
    res = seeded.playbook(REDEPLOY, "-l", "ct300")
    assert not task_ran(res.stdout, "Stop the trainer in stages")
    assert not task_ran(res.stdout, "Start the trainer and wait until it is healthy")
    assert re.search(r"ct300: stop stage 1 \(SIGINT\): [0-9.]+s of [0-9.]+s, \d+ process\(es\) of the run still running",
                     res.stdout), res.stdout[-4000:]
    assert re.search(r"ct300: release \w+ \(installed already\), stopped by SIGINT in 1[4-9]\.[0-9]+s, checkpoint "
                     r"\S+ \(step_dirs\) \(0 steps lost\)", " ".join(res.stdout.split())), res.stdout[-4000:]
