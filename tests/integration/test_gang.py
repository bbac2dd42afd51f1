"""One run across two CTs on two nodes (a gang): real torchrun agents in ct400 (node gn1) and ct401
(node gn2), one CPU rank each over gloo (DFlash's own shape: one process over a CT's GPUs),
rendezvous at ct400 over the testbed's cluster network (a network namespace of the testbed's own),
one checkpoint directory shared by a bind mount point.
A testbed of its own (tests/testlib.py make_gang_inventory), driven as a user drives it:
`make check|restart HOST=dflash_big INVENTORY=...`.

1. check mode shows the whole plan, every CT's command line, and touches nothing;
2. a redeploy stops both CTs' ranks at one moment (the skew reported), writes one checkpoint,
   relaunches both on the new release from it, every rank running and nothing of the old run left;
3. a release whose launch fails on one CT (its node rank 1 raises at its first step): both CTs
   back on the old release, running from that checkpoint, the CT that failed named with its error;
4. one CT locked by another job: the gang is refused whole, nothing touched on either CT;
5. the CTs see different checkpoint directories: refused, the difference named;
(6 and 7, `make stop` and `make start` of the gang, are test_gang_as_run.py's test 1, on its
gang of two ranks in each CT, and test 9 here; each gang launch imports torch in every process.)
8. `make rollback` stops both together and relaunches both on the previous release from the new
   checkpoint, a run whose rank 0 saves alone and whose ranks take the stop request;
9. `make stop` of that run through the stop request: written in both CTs at the gang's moment,
   every rank stops at one step, rank 0's checkpoint, no signal sent to a rank; ct401's rank
   aborts on its way out, so ct400's torchrun agent, left in its exit barrier, is ended.

Gangs as people run them (two ranks in each CT, rank 0 saving alone, a failed stop phase, torch
found through dflash_env, the refused rank counts) are tests/integration/test_gang_as_run.py's, on a
gang testbed of their own so that both files run side by side.
"""

import contextlib
import json
import os
import re
import shlex
import subprocess
import time

import pytest

from testlib import (GANG, GANG_MODEL, REPO, OwnTestbed, interrupt_save_lines, make_gang_inventory, task_ran, tool_env,
                     trainer_source, wait_for)

STATE = "/var/lib/dflash-testbed/gang"
# a run whose rank 0 saves alone and whose ranks take the stop request, the others aborting on
# their way out (tests 8 and 9)
TAKES_REQUESTS = {"dflash_env": {"PYTHONUNBUFFERED": "1", "DFLASH_TEST_RANK0_SAVES_ALONE": "1",
                                 "DFLASH_TEST_STOP_REQUEST": "take", "DFLASH_TEST_ABORT_AT_EXIT": "1"}}
CTS = {"ct400": ("gn1", 400), "ct401": ("gn2", 401)}
# the torchrun workers of each CT: every launch of a rank imports torch (about 1.5 s of CPU), and
# several ranks in one CT are test_gang_as_run.py's
RANKS_PER_CT = 1
CKPT = "/workspace/checkpoints"


class Gang(OwnTestbed):
    def __init__(self, inventory, ranks_per_ct):
        super().__init__(inventory, CTS)
        self.ranks_per_ct = ranks_per_ct

    def make(self, target, *extra_vars):
        return self.finish(self.start(target, *extra_vars))

    def start(self, target, *extra_vars):
        """`make target` on the gang, running in the background until finish()."""
        args = ["make", target, f"HOST={GANG}", f"INVENTORY={self.inventory}"]
        if extra_vars:
            args.append("EXTRA=" + " ".join(f"-e {shlex.quote(json.dumps(v))}" for v in extra_vars))
        return subprocess.Popen(args, cwd=REPO, env=tool_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    @staticmethod
    def finish(proc):
        stdout, stderr = proc.communicate()
        res = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        res.out = " ".join(stdout.split())  # the callback folds long lines
        return res

    def run(self, host):
        """(the agent's PID, its workers' PIDs) in host, or (None, [])."""
        pidfile = self.sh(host, "cat /run/dflash/trainer.pid 2>/dev/null || true").split()
        agent = pidfile[0] if pidfile and self.sh(host, f"test -d /proc/{pidfile[0]} && echo y", False) else None
        workers = self.sh(host, f"pgrep -P {agent} || true").split() if agent else []
        return agent, workers

    def current(self, host):
        return self.sh(host, "readlink /opt/dflash/current").strip().split("/")[-1]

    def supervisor(self, host):
        return json.loads(self.sh(host, "cat /var/lib/dflash/lifecycle/supervisor.json"))

    def back_whole(self, old, rounds, timeout=180, ranks=None):
        """{host: its supervisor's state} once the whole gang runs again, relaunched by its supervisors:
        each CT watching in the round after rounds[host], a new agent (not old[host]'s) with all its
        ranks (ranks, else the inventory's ranks_per_ct)."""
        ranks = ranks or self.ranks_per_ct
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = {host: self.supervisor(host) for host in CTS}
            now = {host: self.run(host) for host in CTS}
            if all(s["state"] == "watching" and s["round"] == rounds[h] + 1 and now[h][0] not in (None, old[h][0])
                   and len(now[h][1]) == ranks for h, s in states.items()):
                return states
            time.sleep(1)
        raise AssertionError(f"the gang did not come back whole: {states} " + "\n".join(
            self.sh(host, "tail -n 8 /var/lib/dflash/lifecycle/supervisor.log", False) for host in CTS))


def running_gang(tmp_path_factory, state_dir, loopback, cluster_net, ranks_per_ct, *first_run):
    """A gang testbed of its own (state_dir, nodes on loopback, cluster_net, ranks_per_ct torchrun
    workers in each CT), its CTs given a model and a corpus and the gang launched by `make restart`
    (with the extra vars of first_run); taken down at the end."""
    inventory = make_gang_inventory(str(tmp_path_factory.mktemp("gang") / "inventory"), state_dir, loopback, cluster_net,
                                    ranks_per_ct=ranks_per_ct)
    bed = Gang(inventory, ranks_per_ct)
    bed.bed.up_fresh()
    try:
        for host in CTS:
            bed.sh(host, f"mkdir -p {GANG_MODEL} /workspace/data && echo '{{}}' > {GANG_MODEL}/config.json "
                         "&& echo 'a b c d e f g h' > /workspace/data/corpus.txt")
        first = bed.make("restart", *first_run)
        assert first.returncode == 0, first.stdout[-6000:]
        yield bed
    finally:
        bed.bed.down()


@pytest.fixture(scope="module")
def gang(tmp_path_factory):
    yield from running_gang(tmp_path_factory, STATE, "127.77.7", "10.77.9", RANKS_PER_CT)


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
    assert all(agent and len(workers) == RANKS_PER_CT for agent, workers in old.values()), old
    release = trainer_source(tmp_path / "next", lambda t: t + "\n# the next release\n")
    res = gang.make("restart", {"trainer_code_src": release})
    assert res.returncode == 0, res.stdout[-6000:]
    head = re.search(rf"gang {GANG} \(2 CTs, c10d rendezvous at 10\.77\.9\.1:29500\): release (\w+), stop signalled "
                     rf"together \(skew of the signals sent ([0-9.]+) ms, ct40[01] first{MARGIN}\), checkpoint {CKPT}/(?P<checkpoint>step_\d+) "
                     r"\(0(?P<lost_up_to> to \d+)? steps lost\), every CT running; ct400 logs ([0-9.]+) tok/s; "
                     r"canary: tok/s [0-9.]+ -> [0-9.]+ ", res.out)
    assert head, res.out
    assert_margin_measured(head)
    # a CT signalled late (a loaded machine) may have stepped past the others: the loss is then a
    # range, and said to be; signalled together, none
    assert head.group("lost_up_to") is None or "(its signal went late)" in head.group(0), head.group(0)
    new_release, checkpoint = head.group(1), head.group("checkpoint")
    assert {gang.current(host) for host in CTS} == {new_release}
    # ct400's rank 0 wrote it, once (at a periodic save's step, that save); both CTs resumed from it;
    # every rank of the new run runs
    old_log = gang.sh("ct400", "cat /workspace/logs/train.log.1")
    assert len(interrupt_save_lines(old_log, f"{CKPT}/{checkpoint}", checkpoint[5:])) == 1, old_log[-3000:]
    for rank, host in enumerate(CTS):
        assert re.search(rf"{host} \(rank {rank}\): PID \d+, 1 ranks \(2 GPU\(s\) each\) healthy after [0-9.]+s, resumed from "
                         rf"{CKPT}/{checkpoint}\b", res.out), res.out
    assert f"resumed from {CKPT}/{checkpoint}" in gang.sh("ct400", "cat /workspace/logs/train.log")
    new = {host: gang.run(host) for host in CTS}
    for host in CTS:
        agent, workers = new[host]
        assert agent and len(workers) == RANKS_PER_CT, (host, new)
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
    # ct401 is named with its error, whichever of its launch, its worker's look once another CT
    # failed, or the read right after the launch saw it end
    assert re.search(r"ct401: (launch failed: )?(its run \(PID|the trainer \(PID|rank processes)", res.out), res.out
    assert "RuntimeError: this release fails on node rank 1" in res.out, res.out
    # the checkpoint the stop wrote; its loss is 0, or a range where a CT's signal went late on a
    # loaded machine (the margin is measured with the stop's own module, the launch's call is heavier)
    saved = re.search(rf"checkpoint {CKPT}/(step_\d+) \(0( to \d+)? steps lost\)", res.out)
    assert saved, res.out
    checkpoint = saved.group(1)
    for host in CTS:
        assert gang.current(host) == old_release
        agent, workers = gang.run(host)
        assert agent and len(workers) == RANKS_PER_CT, host
        assert re.search(rf"{host}: release \w+ .*?rolled back to {old_release}: PID {agent} running again", res.out), res.out
    assert f"resumed from {CKPT}/{checkpoint}" in gang.sh("ct400", "cat /workspace/logs/train.log")


def test_4_a_gang_with_one_ct_locked_by_another_job_is_refused_whole(gang):
    before = {host: gang.run(host) for host in CTS}
    lock = json.dumps({"holder": "awx job 9 (eve)", "since": time.time(), "expires": time.time() + 600})
    gang.sh("ct401", f"echo {shlex.quote(lock)} > /run/dflash/redeploy.lock")
    try:
        res = gang.make("restart")
        assert res.returncode != 0
        # the controller's words, the CT's holder quoted as its word (doubled quotes: YAML's)
        assert re.search(r"the CT is being redeployed by '+awx job 9 \(eve\)'+ \(as its lock file says\)",
                         " ".join(res.out.split())), res.out
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


# the margin before the gang's moment, measured by the job, and how long before it the slowest CT was
# ready (after it, on a machine loaded past the margin: then the report says the signal went late)
MARGIN = (r"; margin (?P<margin>[0-9.]+) s, 2x the measured start of the stop, (?P<measured>[0-9.]+) s, "
          r"(?:the slowest CT \(ct40[01]\) ready [0-9.]+ s before|ct40[01] ready only [0-9.]+ s after) the moment"
          r"(?: \(its signal went late\))?")


def assert_margin_measured(found):
    assert float(found.group("margin")) == max(0.5, round(2 * float(found.group("measured")), 2)), found.group(0)


def test_8_make_rollback_stops_both_together_and_relaunches_both_on_the_previous_release(gang):
    current, previous = (gang.sh("ct400", f"readlink /opt/dflash/{link}").strip().split("/")[-1]
                         for link in ("current", "previous"))
    assert previous and previous != current
    old = {host: gang.run(host) for host in CTS}
    res = gang.make("rollback", TAKES_REQUESTS)
    assert res.returncode == 0, res.stdout[-6000:]
    stopped = re.search(rf"gang {GANG} \(2 CTs\): stop signalled together \(skew of the signals sent [0-9.]+ ms, ct40[01] first{MARGIN}\) "
                        rf"\([^)]*\), checkpoint (?P<checkpoint>{CKPT}/step_\d+)", res.out)
    assert stopped, res.out
    assert_margin_measured(stopped)
    for host in CTS:
        assert gang.current(host) == previous
        agent, workers = gang.run(host)
        assert agent and len(workers) == RANKS_PER_CT and agent != old[host][0], host
        assert re.search(rf"ok: \[{host}\] => msg: rolled back to {previous}, PID {agent}", res.out), res.out
    assert f"resumed from {stopped.group('checkpoint')}" in gang.sh("ct400", "cat /workspace/logs/train.log")


def test_9_make_stop_of_ranks_that_take_the_request_stops_every_rank_at_one_step_with_no_signal(gang):
    """Rank 0 saves alone (the other ranks leave without saving) and the ranks take the stop
    request (test 8's run): with saves_on auto the run announced it, so each CT's stop writes its
    request at the gang's moment, the ranks agree on one step through their all-reduce, and no
    rank gets a signal. ct401's rank aborts on its way out (SIGABRT, as one whose C++ threads
    outlive it): its agent fails, so ct400's agent, its rank gone, would wait out torchrun's 300 s
    exit barrier for it; its stop ends that wait (SIGTERM, then SIGKILL) and says so."""
    res = gang.make("stop", {"trainer_run_saves_on": "auto"})
    assert res.returncode == 0, res.stdout[-6000:]
    signals = {"ct400": r"no signal sent to its workers \(its agent, left waiting in its exit barrier once they had "
                        r"exited, got SIGTERM, then SIGKILL\)", "ct401": "no signal sent"}
    steps = {}
    for host in CTS:
        line = re.search(rf"ok: \[{host}\] => msg: '?stopped PID \d+ by the stop request in [0-9.]+s, {signals[host]} "
                         r"\(request \w+, acknowledged at step (\d+)", res.out)
        assert line, (host, res.out)
        steps[host] = int(line.group(1))
    assert len(set(steps.values())) == 1, steps
    step = steps["ct400"]
    stopped = re.search(rf"gang {GANG} \(2 CTs\): stop requested together \(skew of the requests written [0-9.]+ ms, ct40[01] first; the ranks "
                        rf"of every CT stopped at step {step}{MARGIN}\) \([^)]*\), checkpoint {CKPT}/step_{step}\b", res.out)
    assert stopped, res.out
    assert all(gang.run(host) == (None, []) for host in CTS)
    assert f"stop request at step {step}: checkpoint saved, exiting" in gang.sh("ct400", "cat /workspace/logs/train.log")
    assert "(SIGABRT)" in gang.sh("ct401", "cat /workspace/logs/train.log")
    result = json.loads(gang.sh("ct400", "cat /run/dflash/stop.result.json"))["result"]
    # the barrier waits in a C++ call: SIGTERM's handler would run only once it returned
    assert result["request"]["agent_ended"]["signals"] == ["SIGTERM", "SIGKILL"], result["request"]
    assert [e["signal"] for e in result["timeline"] if e["event"] == "agent_ended"] == ["SIGTERM", "SIGKILL"]


def test_10_a_controller_killed_in_the_gangs_stop_leaves_the_cts_workers_to_finish_it(gang, tmp_path):
    """The whole `make restart` process group killed (SIGKILL, ours: the group we started) while the
    gang's stop waits for rank 0's slow interrupt save: each CT's worker finishes its stop, the
    CTs judge the gang's checkpoint together through the shared directory, and each launches its
    member of the new release; the ranks meet at the rendezvous with no controller at all."""
    slow = {"dflash_env": {"PYTHONUNBUFFERED": "1", "DFLASH_TEST_SLOW_CHECKPOINT_SECONDS": "6",
                           "DFLASH_TEST_SLOW_SAVES": "interrupt"}}
    start = gang.make("start", slow)  # test 9 left the gang stopped: the run that saves slowly
    assert start.returncode == 0, start.stdout[-6000:]
    old = {host: gang.run(host)[0] for host in CTS}
    release = trainer_source(tmp_path / "next", lambda t: t + "\n# after a dead controller\n")
    job = subprocess.Popen(["make", "restart", f"HOST={GANG}", f"INVENTORY={gang.inventory}",
                            "EXTRA=" + " ".join(f"-e {shlex.quote(json.dumps(v))}" for v in (slow, {"trainer_code_src": str(release)}))],
                           cwd=REPO, env=tool_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        gang.live.wait_in_ct("gn1", 400, "test -s /run/dflash/launch.worker -a -s /run/dflash/stop.progress.json",
                             120, "ct400's stop under way in its worker")
        os.killpg(job.pid, 9)
        job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
    try:
        for host, (node, vmid) in CTS.items():  # the forks that ran the task outlive the group and tell the CTs
            gang.live.wait_in_ct(node, vmid, "! test -e /run/dflash/launch.worker && grep -q '\"controller\": \"gone\"' "
                                 "/var/lib/dflash/last-change.json", 300, f"{host}'s worker to end, told its controller is gone")
        # then they end: their answers have no reader
        wait_for("the killed job's forks to end", lambda: not own_forks(release), timeout=60,
                 said=lambda: f"left: {own_forks(release)}")
    finally:
        for pid in own_forks(release):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
    releases = set()
    for host in CTS:
        record = json.loads(gang.sh(host, "cat /var/lib/dflash/last-change.json"))
        assert record["failed"] is False, (host, record)
        agent, workers = gang.run(host)
        assert agent and agent != old[host] and len(workers) == RANKS_PER_CT, (host, record)
        assert gang.sh(host, "test -e /run/dflash/redeploy.lock || echo free").strip() == "free"
        releases.add(gang.current(host))
    assert len(releases) == 1 and "after a dead controller" in gang.sh(
        "ct400", "cat /opt/dflash/current/train_dflash_pipeline.py")
    assert "resumed from /workspace/checkpoints/step_" in gang.sh("ct400", "cat /workspace/logs/train.log")


def own_forks(release):
    """The PIDs of this test's own job's processes that outlived its group (a session of their own):
    those whose command line names the release only this test made."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if str(release).encode() in handle.read() and pid != os.getpid():
                    found.append(pid)
        except OSError:
            continue
    return found


def relaunched_since(gang, host, since, timeout=300):
    """The CT's change record once a relaunch by its post-start hook begun after since has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = json.loads(gang.sh(host, "cat /var/lib/dflash/last-change.json 2>/dev/null || echo {}"))
        if record.get("holder") == "Proxmox post-start hook" and record.get("started_at", 0) > since \
                and record.get("finished_at"):
            return record
        time.sleep(1.0)  # each look is a pct exec: the CPUs are shared with the other tests
    raise AssertionError(f"{host}: no relaunch by its post-start hook ended within {timeout} s: {record}")


def test_11_both_cts_stopped_by_proxmox_keep_the_gangs_checkpoint_and_come_back_as_one(gang):
    """The hookscript installed on the gang (`make pve-hooks`), both CTs shut down by Proxmox at
    once, as a reboot of their nodes does: each CT's pre-stop stops its member with the run's own
    stop (the ranks take the request: they agree on one step and save), then both CTs start, and
    each post-start waits for the other's CT in the shared directory and relaunches its member:
    the ranks meet at the rendezvous and resume from the checkpoint the stop kept."""
    installed = gang.make("pve-hooks")
    assert installed.returncode == 0, installed.stdout[-6000:]
    began = time.time()
    # a restarted CT numbers its processes anew: the run is told by its pidfile's run id
    old = {host: gang.sh(host, "cat /run/dflash/trainer.pid") for host in CTS}
    assert all(gang.run(host)[0] for host in CTS), old
    shutdowns = {host: subprocess.Popen(
        ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={gang.bed.known_hosts}", "-o", "IdentitiesOnly=yes",
         "-i", gang.bed.key, "-p", str(gang.bed.nodes[node]["port"]), f"root@{gang.bed.nodes[node]['address']}",
         f"pct shutdown {vmid}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        for host, (node, vmid) in CTS.items()}
    said = {}
    for host, proc in shutdowns.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (host, out, err)
        said[host] = re.search(rf"^\[{host}\] dflash pre-stop: (.*)$", out, re.M).group(1)
    checkpoint = re.search(r"checkpoint (/workspace/checkpoints/step_\d+)", said["ct400"])
    assert checkpoint and "THE STOP FAILED" not in " ".join(said.values()), said
    for host, (node, vmid) in CTS.items():
        started = gang.live.ssh(node, f"pct start {vmid}", check=True)
        assert "goes on detached in the CT" in started.stdout, (host, started.stdout)
    for host in CTS:
        record = relaunched_since(gang, host, began)
        assert record["failed"] is False, (host, record)
        agent, workers = gang.run(host)
        assert agent and len(workers) == RANKS_PER_CT and gang.sh(host, "cat /run/dflash/trainer.pid") != old[host], (host, record)
    assert f"resumed from {checkpoint.group(1)}" in gang.sh("ct400", "cat /workspace/logs/train.log")


def test_12_one_member_rebooted_by_proxmox_stops_and_brings_back_the_whole_gang(gang):
    """Only ct401's CT rebooted (`pct reboot 401`): its node's hookscript reaches ct400's CT through
    ct400's node (the cluster's root SSH), so both members stop at one moment with the gang's
    checkpoint, and after the start both relaunch and meet at the rendezvous again - no member's
    ranks are left waiting in a collective, none left down."""
    # test 11's install, or this one's when it runs alone (a second one would find nothing to change)
    if not all(re.search(r"^hookscript: ", gang.live.ssh(node, f"pct config {vmid}", check=True).stdout, re.M)
               for node, vmid in CTS.values()):
        installed = gang.make("pve-hooks")
        assert installed.returncode == 0, installed.stdout[-6000:]
    # a restarted CT numbers its processes anew: the run is told by its pidfile's run id
    old = {host: gang.sh(host, "cat /run/dflash/trainer.pid") for host in CTS}
    assert all(gang.run(host)[0] for host in CTS), old
    began = time.time()
    rebooted = gang.live.ssh("gn2", "pct reboot 401", check=True, timeout=300)
    assert re.search(r"^\[ct400\] dflash pre-stop: stopped PID \d+", rebooted.stdout, re.M), rebooted.stdout
    assert re.search(r"^\[ct401\] dflash pre-stop: stopped PID \d+", rebooted.stdout, re.M), rebooted.stdout
    assert "[ct400] dflash post-start: the relaunch" in rebooted.stdout, rebooted.stdout
    # each member's stop sent its first signal, or wrote its request, at the one moment
    first = {host: next(event["at"] for event in json.loads(gang.sh(host, "cat /var/lib/dflash/lifecycle/pre-stop.json"))[
        "timeline"] if event["event"] in ("signal", "request")) for host in CTS}
    assert abs(first["ct400"] - first["ct401"]) < 0.5, first
    for host in CTS:
        record = relaunched_since(gang, host, began)
        assert record["failed"] is False, (host, record)
        agent, workers = gang.run(host)
        assert agent and len(workers) == RANKS_PER_CT and gang.sh(host, "cat /run/dflash/trainer.pid") != old[host], (host, record)


def test_13_a_rank_killed_on_one_ct_brings_the_whole_gang_back_through_its_supervisors(gang):
    """One rank of ct401 killed (SIGKILL, as the OOM killer does): ct401's agent ends, and each CT's
    supervisor says its member is down in the gang's round - ct400's ends its own run, whose ranks
    wait in a collective for a peer that is gone, if its agent has not ended already. Once both are
    down, both relaunch after one back-off into one rendezvous, resuming from the gang's newest
    checkpoint: every rank runs again, counted once for the gang."""
    old = {host: gang.run(host) for host in CTS}
    assert all(agent and len(workers) == RANKS_PER_CT for agent, workers in old.values()), old
    # the run's generation since the job's launch (the hook's relaunches of tests 11 and 12 count too)
    rounds = {host: gang.supervisor(host)["round"] for host in CTS}
    assert len(set(rounds.values())) == 1, rounds
    gang.sh("ct401", f"kill -KILL {old['ct401'][1][0]}")
    states = gang.back_whole(old, rounds)
    ends = {host: states[host]["ends"][-1] for host in CTS}
    # ct401's own crash: its agent's exit, or - where ct400's end (caused by it) reached ct401's
    # supervisor before its agent had ended - the agent's word that the rank was killed
    assert (ends["ct401"]["cause"].startswith("crash: the trainer exited with status 1")
            or re.match(r"crash: the trainer's launcher: its worker local_rank 0 \(PID \d+\) was killed by SIGKILL",
                        ends["ct401"]["cause"])), ends
    assert ends["ct400"]["cause"].startswith(("crash: the trainer exited", "ct401 of the gang went down")), ends
    # one back-off for the gang: both relaunches meet in the next round's rendezvous, resuming from one checkpoint
    assert all(e["relaunch"].startswith("trainer PID") for e in ends.values()), ends
    assert "resumed from /workspace/checkpoints/step_" in ends["ct400"]["relaunch"], ends
