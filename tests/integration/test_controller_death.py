"""A controller that dies in the middle of a redeploy: `ansible-playbook`'s whole process group
killed (SIGKILL, SIGTERM, SIGINT, as a laptop's VPN drop, an AWX cancel or an evicted pod would end
it) at chosen moments. From the stop's first signal on, the CT's worker owns the redeploy: the run
must be running again (the new release, or the one of before after a failed launch), the CT's
record must say that its controller did not see the end, and the next redeploy must run within
one lease."""

import json
import os
import re
import shlex
import signal
import subprocess
import time

import pytest

from testlib import BIN, END_RUNS, REPO, tool_env, trainer_source

REDEPLOY = os.path.join(REPO, "redeploy.yml")
STATUS = os.path.join(REPO, "playbooks", "status.yml")
SEED = os.path.join(REPO, "playbooks", "testbed_seed.yml")
HOST, NODE, VMID = "ct300", "pve2", 300
RECORD = "/var/lib/dflash/last-change.json"


def in_ct(testbed, command, check=True):
    return testbed.in_ct(NODE, VMID, command, check=check)


def trainer_pids(testbed):
    return in_ct(testbed, "pgrep -f train_dflash_pipeline[.]py", check=False).stdout.split()


def record(testbed):
    return json.loads(in_ct(testbed, f"cat {RECORD}").stdout)


@pytest.fixture(scope="module")
def running(testbed):
    """ct300 runs a release of the project's own, saving its interrupt checkpoint slowly (4 s):
    the stop's wait for it is where a controller dies."""
    in_ct(testbed, END_RUNS, check=False)  # trainers of this testbed, their supervisors first: ours
    in_ct(testbed, f"rm -rf /workspace/checkpoints /opt/dflash /root/train_dflash_pipeline.py* {RECORD}")
    testbed.playbook(SEED, "-e", f"seed_hosts={HOST}")
    testbed.playbook(REDEPLOY, "-l", HOST, "-e", json.dumps(SLOW))
    return testbed


SLOW = {"dflash_env": {"DFLASH_TEST_SLOW_CHECKPOINT_SECONDS": "4", "DFLASH_TEST_SLOW_SAVES": "interrupt"}}


def killed_at(testbed, moment, signum, *args, frozen_until=None):
    """Run redeploy.yml -l ct300 (args added) in a process group of its own and, once the shell
    condition moment holds in the CT, send signum to the whole group (ansible-playbook and what
    shares its group: ours, by the group we started). frozen_until: a shell condition in the CT;
    the group is stopped (SIGSTOP) at moment, signalled once it holds, then continued - a job
    cancelled after the CT answered and before ansible-playbook read the answer. Returns the
    playbook's output."""
    playbook = subprocess.Popen([os.path.join(BIN, "ansible-playbook"), REDEPLOY, "-l", HOST, *args], cwd=REPO,
                                env=tool_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        seen = testbed.ssh(NODE, f"pct exec {VMID} -- timeout 120 sh -c "
                                 f"{shlex.quote(f'until {moment}; do sleep 0.02; done')}", timeout=180)
        assert seen.returncode == 0 and playbook.poll() is None, f"never saw {moment!r} while the job ran"
        if frozen_until:
            os.killpg(playbook.pid, signal.SIGSTOP)
            testbed.wait_in_ct(NODE, VMID, frozen_until, 120, "the CT's answer while the job was stopped")
        os.killpg(playbook.pid, signum)
        if frozen_until:
            os.killpg(playbook.pid, signal.SIGCONT)
        output = playbook.communicate(timeout=120)[0]
    finally:
        if playbook.poll() is None:
            os.killpg(playbook.pid, signal.SIGKILL)
            playbook.wait()
    return output


# the release being installed: the preflight has returned and the launch's call, which stops, has
# not begun (it renews the lock with its own phase)
INSTALLING = "grep -q '\"phase\": \"release install\"' /run/dflash/redeploy.lock"
# no lock, or its lease has ended (the CT's clock is the node's): the last renewal is the killed
# job's fork's, whenever its call ended
LEASE_ENDED = ("python3 -c \"import json, os, sys, time; p = '/run/dflash/redeploy.lock'; "
               "sys.exit(0 if not os.path.exists(p) or json.load(open(p))['expires'] < time.time() else 1)\"")


def told_gone(testbed):
    """The record once the CT knows its controller is gone: the worker's end, or a round trip later
    when only ansible-playbook died (its fork tells the CT once the module has returned)."""
    testbed.wait_in_ct(NODE, VMID, f"grep -q '\"controller\": \"gone\"' {RECORD}", 30,
                       "the CT told that its controller is gone", lambda: in_ct(testbed, f"cat {RECORD}").stdout)
    return record(testbed)


def wait_finished(testbed, since):
    """Until the CT's record shows a change begun after since that has ended."""
    testbed.wait_in_ct(NODE, VMID, f"python3 -c \"import json,sys; r=json.load(open('{RECORD}')); "
                                   f"sys.exit(0 if r['started_at'] > {since} and r['finished_at'] else 1)\"",
                       120, "the worker's change to end")


# the CT's call has answered: it gives the lock back as it writes its answer (a healthy launch)
ANSWERED = "test ! -e /run/dflash/redeploy.lock"


@pytest.mark.parametrize("signum, answered", [(signal.SIGKILL, False), (signal.SIGTERM, False), (signal.SIGINT, True)])
def test_a_controller_killed_in_the_stop_leaves_the_worker_to_finish_the_redeploy(running, tmp_path, signum, answered):
    """Killed while the stop waits for the interrupt checkpoint, a release to push first (the stop,
    the activation and the launch are one worker's transaction). answered: the job is stopped there
    and cancelled only once the CT's call has answered, an answer ansible-playbook never shows; the
    CT saw its controller attached to the end, and only the job's callback can tell it (state=cancelled)."""
    src = trainer_source(tmp_path / "next", lambda text: text + f"\n# release after {signum.name}\n")
    before = trainer_pids(running)
    since = time.time()
    output = killed_at(running, "test -s /run/dflash/stop.progress.json -a -s /run/dflash/launch.worker", signum,
                       "-e", f"trainer_code_src={src}", "-e", json.dumps(SLOW), frozen_until=ANSWERED if answered else None)
    wait_finished(running, since)
    done = told_gone(running)
    assert done["failed"] is False, (done, output[-3000:])
    assert re.match(r"trainer PID \d+ healthy", done["outcome"]), done
    now = trainer_pids(running)
    assert len(now) == 1 and now != before
    assert in_ct(running, "grep -c 'release after' /opt/dflash/current/train_dflash_pipeline.py").stdout.strip() == "1"
    # the CT is free at once: nobody would give the lock back, so the worker did
    assert in_ct(running, "test -e /run/dflash/redeploy.lock", check=False).returncode == 1
    status = running.playbook(STATUS, "-l", HOST)
    assert re.search(r"the redeploy started at [0-9: -]+UTC by \S+.* finished without its controller at",
                     " ".join(status.stdout.split())), status.stdout[-3000:]
    # the next redeploy runs at once, and reports the unattended one first (once)
    after = running.playbook(REDEPLOY, "-l", HOST, "-e", f"trainer_code_src={src}", "-e", json.dumps(SLOW))
    out = " ".join(after.stdout.split())
    assert "failed=0" in out and "before this job, the redeploy started at" in out, out[-3000:]
    assert record(running)["controller"] == "attached"


def test_a_controller_killed_in_the_new_runs_health_wait_leaves_it_running(running):
    """SIGKILL once the new trainer has started and the worker waits for its health (SIGTERM and
    SIGINT reach ansible-playbook alike: test 1): the task's fork, whose parent died, tells the CT
    once the module returns, and gives the lock back."""
    before = in_ct(running, "cut -d' ' -f1 /run/dflash/trainer.pid").stdout.strip()
    since = time.time()
    killed_at(running, "test -s /run/dflash/launch.worker -a "
                       f"\"$(cut -d' ' -f1 /run/dflash/trainer.pid)\" != {before}", signal.SIGKILL)
    wait_finished(running, since)
    done = told_gone(running)
    assert done["failed"] is False, done
    now = in_ct(running, "cut -d' ' -f1 /run/dflash/trainer.pid").stdout.strip()
    assert trainer_pids(running) == [now] and done["outcome"].startswith(f"trainer PID {now} healthy"), done
    running.wait_in_ct(NODE, VMID, "! test -e /run/dflash/redeploy.lock", 15, "the lock given back")


def test_a_controller_killed_before_the_first_signal_leaves_the_run_alone_and_the_lock_for_one_lease(running, tmp_path):
    """SIGKILL between the preflight (which took the lock) and the stop: nothing was touched, and
    the lock ends with its lease (15 s here): the next redeploy is refused, saying when, then runs."""
    src = trainer_source(tmp_path / "next", lambda text: text + "\n# never launched\n")
    before = trainer_pids(running)
    lease = ["-e", "redeploy_lock_ttl=15"]
    killed_at(running, INSTALLING, signal.SIGKILL, "-e", f"trainer_code_src={src}", *lease)
    time.sleep(2)  # the install's fork outlives ansible-playbook (a session of its own) and ends its call
    assert trainer_pids(running) == before  # untouched
    refused = running.playbook(REDEPLOY, "-l", HOST, *lease, check=False)
    words = " ".join(refused.stdout.split())
    if "is free once the lease ends" in words:  # its preflight came within the lease: refused, naming its last renewal
        assert refused.returncode != 0 and re.search(r"its lease runs until \S+ \S+ UTC, renewed \d+ s ago", words), words
        running.wait_in_ct(NODE, VMID, LEASE_ENDED, 60, "the lease's end")
        assert "failed=0" in running.playbook(REDEPLOY, "-l", HOST, *lease).stdout
    else:  # the machine was slow: the lease had ended already, and the job ran
        assert refused.returncode == 0, refused.stdout[-3000:]
    assert len(trainer_pids(running)) == 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_controller_cancelled_before_the_first_signal_gives_the_lock_back_at_once(running, tmp_path, signum):
    """A cancel (AWX: SIGINT, then SIGTERM) between the preflight and the stop: the job's callback
    gives the lock back before ansible-playbook exits, and says that nothing was touched."""
    src = trainer_source(tmp_path / "next", lambda text: text + f"\n# cancelled by {signum.name}\n")
    before = trainer_pids(running)
    output = killed_at(running, INSTALLING, signum, "-e", f"trainer_code_src={src}")
    assert trainer_pids(running) == before  # untouched
    assert in_ct(running, "test -e /run/dflash/redeploy.lock", check=False).returncode == 1, output[-3000:]
    assert f"ct300: {signum.name} before the first signal: nothing was touched, the lock is given back" in output
    assert "failed=0" in running.playbook(REDEPLOY, "-l", HOST).stdout  # at once


def test_a_failed_launch_is_rolled_back_by_the_worker_without_its_controller(running, tmp_path):
    """A release that crashes at start, the controller killed once the worker runs: the worker stops
    nothing more, sets current back and relaunches the release of before from the checkpoint its
    stop wrote; the record says so and what runs."""
    current = in_ct(running, "readlink /opt/dflash/current").stdout.strip()
    src = trainer_source(tmp_path / "broken", lambda t: t.replace(
        "def main(argv=None):\n", "def main(argv=None):\n    raise SystemExit('this release is broken')\n", 1))
    since = time.time()
    killed_at(running, "test -s /run/dflash/launch.worker", signal.SIGKILL, "-e", f"trainer_code_src={src}",
              "-e", json.dumps(SLOW))
    wait_finished(running, since)
    done = told_gone(running)
    assert done["failed"] is True, done
    assert "this release is broken" in done["outcome"] and "rolled back: trainer PID" in done["outcome"], done
    assert in_ct(running, "readlink /opt/dflash/current").stdout.strip() == current
    pids = trainer_pids(running)
    assert len(pids) == 1 and done["outcome"].endswith(f"trainer PID {pids[0]} runs"), (pids, done)
    assert "resumed from /workspace/checkpoints/step_" in in_ct(running, "tail -n 40 /workspace/logs/train.log").stdout
