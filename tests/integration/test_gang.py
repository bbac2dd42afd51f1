"""One run across two CTs on two nodes (a gang): real torchrun agents in ct400 (node gn1) and ct401
(node gn2), two CPU ranks each over gloo, rendezvous at ct400 over the testbed's cluster network
(a network namespace of the testbed's own), one checkpoint directory shared by a bind mount point.
A testbed of its own (tests/testlib.py make_gang_inventory), driven as a user drives it:
`make check|restart HOST=dflash_big INVENTORY=...`.

1. check mode shows the whole plan, every CT's command line, and touches nothing;
2. a redeploy stops both CTs' ranks at one moment (the skew reported), writes one checkpoint,
   relaunches both on the new release from it, every rank running and nothing of the old run left;
3. a release whose launch fails on one CT (its node rank 1 raises at its first step): both CTs
   back on the old release, running from that checkpoint, the CT that failed named with its error;
4. one CT locked by another job: the gang is refused whole, nothing touched on either CT;
5. the CTs see different checkpoint directories: refused, the difference named;
6. `make stop` signals both at one moment and reports the gang's skew and checkpoint;
7. `make start` launches both from that checkpoint;
8. `make rollback` stops both together and relaunches both on the previous release from the new
   checkpoint;
9. rank 0 saves alone (the other ranks leave at once): the gang's checkpoint is judged once every
   CT has stopped, and make stop, make start and make restart succeed;
10. a stop phase that fails (a save cut): both CTs run the release of before again from the
    checkpoint, and the redeploy fails naming the cause;
11. torch found only through dflash_env's PYTHONPATH: the preflight finds it as the run does;
12. one rank per CT over all of its GPUs, as DFlash's trainer runs; ranks that do not divide the
    GPUs are refused, with the numbers.
"""

import json
import os
import re
import shlex
import subprocess
import time

import pytest

from testlib import GANG, REPO, TORCH_PYTHON, LiveTestbed, make_gang_inventory, task_ran, testbed_mod, tool_env, trainer_source

STATE = "/var/lib/dflash-testbed/gang"
CTS = {"ct400": ("gn1", 400), "ct401": ("gn2", 401)}
CKPT = "/workspace/checkpoints"


class Gang:
    def __init__(self, inventory):
        self.inventory = inventory
        self.bed = testbed_mod.Testbed(inventory)
        self.live = LiveTestbed(self.bed)

    def sh(self, host, command, check=True):
        node, vmid = CTS[host]
        res = self.live.ssh(node, f"pct exec {vmid} -- sh -c {shlex.quote(command)}")
        assert res.returncode == 0 or not check, f"{host}: {command}: {res.stderr}"
        return res.stdout

    def make(self, target, *extra_vars):
        args = ["make", target, f"HOST={GANG}", f"INVENTORY={self.inventory}"]
        if extra_vars:
            args.append("EXTRA=" + " ".join(f"-e {shlex.quote(json.dumps(v))}" for v in extra_vars))
        res = subprocess.run(args, cwd=REPO, env=tool_env(), capture_output=True, text=True, check=False)
        res.out = " ".join(res.stdout.split())  # the callback folds long lines
        return res

    def run(self, host):
        """(the agent's PID, its workers' PIDs) in host, or (None, [])."""
        pidfile = self.sh(host, "cat /run/dflash/trainer.pid 2>/dev/null || true").split()
        agent = pidfile[0] if pidfile and self.sh(host, f"test -d /proc/{pidfile[0]} && echo y", False) else None
        workers = self.sh(host, f"pgrep -P {agent} || true").split() if agent else []
        return agent, workers

    def current(self, host):
        return self.sh(host, "readlink /opt/dflash/current").strip().split("/")[-1]


@pytest.fixture(scope="module")
def gang(tmp_path_factory):
    inventory = make_gang_inventory(str(tmp_path_factory.mktemp("gang") / "inventory"), STATE, "127.77.7", "10.77.9")
    bed = Gang(inventory)
    bed.bed.up()
    try:
        for host in CTS:
            bed.sh(host, "mkdir -p /dev/shm/models/target /workspace/data && echo '{}' > /dev/shm/models/target/config.json "
                         "&& echo 'a b c d e f g h' > /workspace/data/corpus.txt")
        first = bed.make("restart")
        assert first.returncode == 0, first.stdout[-6000:]
        yield bed
    finally:
        bed.bed.down()


def test_1_check_mode_shows_the_whole_plan_for_every_ct_and_touches_nothing(gang):
    before = {host: gang.run(host) for host in CTS}
    res = gang.make("check")
    assert res.returncode == 0, res.stdout[-4000:]
    assert (f"gang {GANG}: 2 CTs ct400 (rank 0), ct401 (rank 1)" in res.out
            and "the stop signals every CT at one moment" in res.out), res.out
    ids = set(re.findall(r"--rdzv-id (\S+)", res.out))
    assert len(ids) == 1, ids  # one rendezvous for the gang's launch
    for host, address in (("ct400", "10.77.9.1"), ("ct401", "10.77.9.2")):
        line = re.search(rf"{host}: (\S+ -u -m torch\.distributed\.run .*?--resume)", res.out).group(1)
        assert "--nnodes 2" in line and "--rdzv-endpoint 10.77.9.1:29500" in line, line
        assert f"--local-addr {address}" in line and "--rdzv-backend c10d" in line, line
    assert {host: gang.run(host) for host in CTS} == before


def test_2_a_redeploy_stops_both_cts_together_and_resumes_both_from_one_checkpoint(gang, tmp_path):
    old = {host: gang.run(host) for host in CTS}
    assert all(agent and len(workers) == 2 for agent, workers in old.values()), old
    release = trainer_source(tmp_path / "next", lambda t: t + "\n# the next release\n")
    res = gang.make("restart", {"trainer_code_src": release})
    assert res.returncode == 0, res.stdout[-6000:]
    head = re.search(rf"gang {GANG} \(2 CTs, c10d rendezvous at 10\.77\.9\.1:29500\): release (\w+), stop signalled "
                     rf"together \(skew ([0-9.]+) ms, ct40[01] first\), checkpoint {CKPT}/(step_\d+) \(0 steps lost\), "
                     r"every CT running; ct400 logs ([0-9.]+) tok/s; canary: tok/s [0-9.]+ -> [0-9.]+ ", res.out)
    assert head, res.out
    new_release, checkpoint = head.group(1), head.group(3)
    assert {gang.current(host) for host in CTS} == {new_release}
    # ct400's rank 0 wrote it, once; both CTs resumed from it; every rank of the new run runs
    assert re.findall(rf"checkpoint saved: {CKPT}/step_\d+ \(step \d+, interrupt\)",
                      gang.sh("ct400", "cat /workspace/logs/train.log.1")) == [
        f"checkpoint saved: {CKPT}/{checkpoint} (step {checkpoint[5:]}, interrupt)"]
    for rank, host in enumerate(CTS):
        assert re.search(rf"{host} \(rank {rank}\): PID \d+, 2 ranks \(1 GPU\(s\) each\) healthy after [0-9.]+s, resumed from "
                         rf"{CKPT}/{checkpoint}\b", res.out), res.out
    assert f"resumed from {CKPT}/{checkpoint}" in gang.sh("ct400", "cat /workspace/logs/train.log")
    new = {host: gang.run(host) for host in CTS}
    for host in CTS:
        agent, workers = new[host]
        assert agent and len(workers) == 2, (host, new)
        # nothing of the old run left in either CT
        for pid in [old[host][0], *old[host][1]]:
            assert not gang.sh(host, f"test -d /proc/{pid} && cat /proc/{pid}/cmdline || true"), (host, pid)


def test_3_a_launch_that_fails_on_one_ct_rolls_both_back_and_names_it(gang, tmp_path):
    old_release = gang.current("ct400")
    crash = "    corpus = load_corpus(args.data_dir)\n"
    failing = trainer_source(tmp_path / "failing", lambda t: t.replace(
        crash, crash + '    if os.environ.get("GROUP_RANK") == "1":\n'
                       '        raise RuntimeError("this release fails on node rank 1")\n'))
    res = gang.make("restart", {"trainer_code_src": failing})
    assert res.returncode != 0
    # ct401 is named with its error, whichever of its launch or the read right after it saw it end
    assert re.search(r"ct401: (its run \(PID|the trainer \(PID|rank processes)", res.out), res.out
    assert "RuntimeError: this release fails on node rank 1" in res.out, res.out
    checkpoint = re.search(rf"checkpoint {CKPT}/(step_\d+) \(0 steps lost\)", res.out).group(1)
    for host in CTS:
        assert gang.current(host) == old_release
        agent, workers = gang.run(host)
        assert agent and len(workers) == 2, host
        assert re.search(rf"{host}: release \w+ .*?rolled back to {old_release}: PID {agent} running again", res.out), res.out
    assert f"resumed from {CKPT}/{checkpoint}" in gang.sh("ct400", "cat /workspace/logs/train.log")


def test_4_a_gang_with_one_ct_locked_by_another_job_is_refused_whole(gang):
    before = {host: gang.run(host) for host in CTS}
    lock = json.dumps({"holder": "awx job 9 (eve)", "since": time.time(), "expires": time.time() + 600})
    gang.sh("ct401", f"echo {shlex.quote(lock)} > /run/dflash/redeploy.lock")
    try:
        res = gang.make("restart")
        assert res.returncode != 0
        assert "CT is being redeployed by awx job 9 (eve)" in res.out, res.out
        assert f"gang {GANG} after its preflight: ct401:" in res.out, res.out
        assert not task_ran(res.stdout, "Stop the trainer in stages")
        assert {host: gang.run(host) for host in CTS} == before
        assert gang.sh("ct400", "test -e /run/dflash/redeploy.lock && echo held || echo free").strip() == "free"
        assert "awx job 9 (eve)" in gang.sh("ct401", "cat /run/dflash/redeploy.lock")
    finally:
        gang.sh("ct401", "rm -f /run/dflash/redeploy.lock")


def test_5_cts_that_see_different_checkpoint_directories_are_refused(gang):
    before = {host: gang.run(host) for host in CTS}
    # ct401 sees a directory of its own over the shared one (as a CT without the mount point would)
    gang.sh("ct401", f"mount -t tmpfs gang-test {CKPT} && mkdir {CKPT}/step_1 && touch {CKPT}/step_1/COMPLETE")
    try:
        res = gang.make("restart")
        assert res.returncode != 0
        refused = re.search(r"ct401 does not see the marks of ct400 in \S+/\.dflash-gang/\S+ within [0-9.]+s \(only on "
                            r"ct400: (step_\d+)[^)]*only on ct401: step_1\)", res.out)
        assert refused, res.out
        assert {host: gang.run(host) for host in CTS} == before
    finally:
        gang.sh("ct401", f"umount {CKPT}")


def test_6_make_stop_stops_both_cts_at_one_moment_with_the_gang_checkpoint(gang):
    res = gang.make("stop")
    assert res.returncode == 0, res.stdout[-4000:]
    saved = re.findall(rf"ok: \[ct40[01]\] => msg: stopped PID \d+ at stage 1 \(SIGINT\) in [0-9.]+s; new checkpoint "
                       rf"({CKPT}/step_\d+)", res.out)
    assert len(saved) == 2 and len(set(saved)) == 1, res.out  # both CTs see the one checkpoint ct400's rank 0 wrote
    assert re.search(rf"gang {GANG} \(2 CTs\): stop signalled together \(skew [0-9.]+ ms, ct40[01] first\) "
                     rf"\(ct40[01] \+0\.0 ms, ct40[01] \+[0-9.]+ ms\), checkpoint {saved[0]}", res.out), res.out
    assert all(gang.run(host) == (None, []) for host in CTS)


def test_7_make_start_launches_both_cts_from_the_gang_checkpoint(gang):
    newest = gang.sh("ct400", f"cat {CKPT}/latest").strip().split("/")[-1]
    res = gang.make("start")
    assert res.returncode == 0, res.stdout[-4000:]
    for host in CTS:
        agent, workers = gang.run(host)
        assert agent and len(workers) == 2, (host, res.out)
    assert f"resumed from {CKPT}/{newest}" in gang.sh("ct400", "cat /workspace/logs/train.log")


def test_8_make_rollback_stops_both_together_and_relaunches_both_on_the_previous_release(gang):
    current, previous = (gang.sh("ct400", f"readlink /opt/dflash/{link}").strip().split("/")[-1]
                         for link in ("current", "previous"))
    assert previous and previous != current
    old = {host: gang.run(host) for host in CTS}
    res = gang.make("rollback")
    assert res.returncode == 0, res.stdout[-6000:]
    stopped = re.search(rf"gang {GANG} \(2 CTs\): stop signalled together \(skew [0-9.]+ ms, ct40[01] first\) "
                        rf"\([^)]*\), checkpoint ({CKPT}/step_\d+)", res.out)
    assert stopped, res.out
    for host in CTS:
        assert gang.current(host) == previous
        agent, workers = gang.run(host)
        assert agent and len(workers) == 2 and agent != old[host][0], host
        assert re.search(rf"ok: \[{host}\] => msg: rolled back to {previous}, PID {agent}", res.out), res.out
    assert f"resumed from {stopped.group(1)}" in gang.sh("ct400", "cat /workspace/logs/train.log")


def test_9_rank_0_saving_alone_is_judged_once_the_whole_gang_has_stopped(gang):
    """The common pattern: rank 0 saves (10 s here), the other ranks leave on KeyboardInterrupt at
    once, so ct401's stop ends before ct400's rank 0 has renamed its checkpoint into place (a few
    seconds on a loaded machine: the save outlasts it). The
    gang's checkpoint is judged on every CT once every CT has stopped: make stop, make start and
    a make restart whose stop would have raced all succeed, and the relaunch resumes from it."""
    alone = {"dflash_env": {"PYTHONUNBUFFERED": "1", "DFLASH_TEST_RANK0_SAVES_ALONE": "1",
                            "DFLASH_TEST_SLOW_CHECKPOINT_SECONDS": "10", "DFLASH_TEST_SLOW_SAVES": "interrupt"}}
    res = gang.make("restart", alone)  # the run the next stop meets saves as rank 0 alone
    assert res.returncode == 0, res.stdout[-6000:]
    res = gang.make("stop", alone)
    assert res.returncode == 0, res.stdout[-6000:]
    # ct401's own stop ended before the save was complete: the race the gang's judgement waits out
    assert re.search(r"ok: \[ct401\] => msg: '?stopped PID \d+ at stage 1 \(SIGINT\) in [0-9.]+s; NO new checkpoint",
                     res.out), res.out
    saved = re.search(rf"ok: \[ct400\] => msg: '?stopped PID \d+ at stage 1 \(SIGINT\) in [0-9.]+s; new checkpoint "
                      rf"({CKPT}/step_\d+)", res.out).group(1)
    assert re.search(rf"gang {GANG} \(2 CTs\): stop signalled together .*?, checkpoint {saved}", res.out), res.out
    assert all(gang.run(host) == (None, []) for host in CTS)
    res = gang.make("start", alone)
    assert res.returncode == 0, res.stdout[-6000:]
    assert f"resumed from {saved}" in gang.sh("ct400", "cat /workspace/logs/train.log")
    # the run it starts makes no periodic save: test 10's stop of it has only the interrupt save to cut
    quiet = {"dflash_env": dict(alone["dflash_env"], DFLASH_TEST_INTERVAL_SAVES="0")}
    res = gang.make("restart", quiet)
    assert res.returncode == 0, res.stdout[-6000:]
    checkpoint = re.search(rf"checkpoint ({CKPT}/step_\d+) \(0 steps lost\), every CT running", res.out)
    assert checkpoint and checkpoint.group(1) != saved, res.out
    assert f"resumed from {checkpoint.group(1)}" in gang.sh("ct400", "cat /workspace/logs/train.log")


def test_10_a_gang_whose_stop_phase_failed_runs_again_from_its_checkpoint(gang, tmp_path):
    """The run of test 9 saves for 10 s on SIGINT; a ladder that sends SIGTERM after 1 s cuts that
    save, so no CT sees a new checkpoint and the stop phase fails. Every CT's run is gone and the
    older checkpoint is complete: the release of before runs again from it on both CTs, and the
    redeploy fails naming the cause."""
    old_release = gang.current("ct400")
    release = trainer_source(tmp_path / "next", lambda t: t + "\n# a release the stop never reaches\n")
    res = gang.make("restart", {"trainer_code_src": release, "trainer_stop_graceful_wait_cap": 1,
                                "trainer_stop_ladder": [{"signal": "SIGINT", "scope": "main", "wait": 1},
                                                        {"signal": "SIGTERM", "scope": "tree", "wait": 10},
                                                        {"signal": "SIGKILL", "scope": "tree", "wait": 5}]})
    assert res.returncode != 0
    assert f"gang {GANG} after its stop: no CT of the gang saw a new sound checkpoint" in res.out, res.out
    assert "(the release of before, relaunched from its checkpoint after the stop phase failed)" in res.out, res.out
    # the newest complete checkpoint when the stop failed (a periodic save may land during the job)
    newest = re.search(rf"NO new checkpoint \(newest complete: ({CKPT}/step_\d+), from before the stop\)", res.out)
    assert newest, res.out
    for host in CTS:
        assert gang.current(host) == old_release
        agent, workers = gang.run(host)
        assert agent and len(workers) == 2, (host, res.out)
        assert f"{host}: release" in res.out and f"resumed from {newest.group(1)}" in res.out, res.out
    assert f"resumed from {newest.group(1)}" in gang.sh("ct400", "cat /workspace/logs/train.log")


def test_11_a_run_whose_torch_only_dflash_env_finds_is_launched(gang):
    """trainer_run_python is the CT's bare python3 and torch comes from the PYTHONPATH the run's
    environment sets, as the run itself finds it: the preflight's probe finds it the same way."""
    site = os.path.dirname(os.path.dirname(gang.sh("ct400", f"{TORCH_PYTHON} -c 'import torch; print(torch.__file__)'")
                                           .strip()))
    env_torch = {"trainer_run_python": "/usr/bin/python3",
                 "dflash_env": {"PYTHONUNBUFFERED": "1", "PYTHONPATH": site}}
    assert "No module named 'torch'" in gang.sh("ct400", "/usr/bin/python3 -c 'import torch' 2>&1 || true")
    res = gang.make("restart", env_torch)
    assert res.returncode == 0, res.stdout[-6000:]
    for host in CTS:
        agent, workers = gang.run(host)
        assert agent and len(workers) == 2, host
        assert "/usr/bin/python3" in gang.sh(host, f"tr '\\0' ' ' < /proc/{agent}/cmdline")


def test_12_a_dflash_shaped_gang_runs_one_rank_per_ct_over_all_of_its_gpus(gang):
    """DFlash's own trainer is one process over a CT's GPUs: nproc_per_node 1 on CTs that give
    the run 2 GPUs is valid, and the report says each rank drives 2 GPUs."""
    one_rank = {"trainer_run_launcher_options": {"nproc_per_node": 1}}
    res = gang.make("restart", one_rank)
    assert res.returncode == 0, res.stdout[-6000:]
    for rank, host in enumerate(CTS):
        assert re.search(rf"{host} \(rank {rank}\): PID \d+, 1 ranks \(2 GPU\(s\) each\) healthy after", res.out), res.out
        agent, workers = gang.run(host)
        assert agent and len(workers) == 1, (host, res.out)
    refused = gang.make("check", {"trainer_run_launcher_options": {"nproc_per_node": 3}})
    assert refused.returncode != 0
    assert "nproc_per_node: 3 ranks do not divide the 2 GPUs the run is given" in refused.out, refused.out
