"""Gangs as people run them, on a two-CT gang testbed of its own (ct400 on gn1, ct401 on gn2:
tests/integration/test_gang.py's shape, other addresses, so that the two files run side by side),
driven as a user drives it: `make stop|start|restart HOST=dflash_big INVENTORY=...`.

1. rank 0 saves alone (the other ranks leave at once): the gang's checkpoint is judged once every
   CT has stopped, and make stop, make start and make restart succeed;
2. a stop phase that fails (a save cut): both CTs run the release of before again from the
   checkpoint, and the redeploy fails naming the cause;
3. DFlash's own shape, one rank per CT over all of its GPUs, its torch found only through
   dflash_env's PYTHONPATH: the preflight finds it as the run does; ranks that do not divide the
   GPUs are refused, with the numbers;
4. a rank blocked in a collective (one rank per CT): the whole gang comes back from its newest
   checkpoint.

Every launch of a rank or an agent imports torch (about 1.5 s of CPU): the scenarios that do not
need two ranks in a CT run one, and one launch serves two promises where they do not meet.
"""

import os
import re
import time

import pytest

from testlib import GANG, TORCH_PYTHON, trainer_source
from test_gang import CKPT, CTS, running_gang

STATE = "/var/lib/dflash-testbed/gang-as-run"


RELEASE_SAVE = "/tmp/dflash-test-release-save"  # in ct400, where rank 0 saves
# no periodic save: one that lands as the SIGINT does (in the same step) would be the interrupt's
# checkpoint at once, before ct401's stop ends; and test 2's stop has only the interrupt save to cut
ALONE = {"dflash_env": {"PYTHONUNBUFFERED": "1", "DFLASH_TEST_RANK0_SAVES_ALONE": "1",
                        "DFLASH_TEST_SLOW_CHECKPOINT_SECONDS": "10", "DFLASH_TEST_SLOW_SAVES": "interrupt",
                        "DFLASH_TEST_SAVE_HELD_BY": RELEASE_SAVE, "DFLASH_TEST_INTERVAL_SAVES": "0"}}


@pytest.fixture(scope="module")
def gang(tmp_path_factory):
    """The gang launched as the run test 1's stop meets: rank 0 saves alone (ALONE)."""
    yield from running_gang(tmp_path_factory, STATE, "127.77.9", "10.77.11", 2, ALONE)


def in_each_ct(gang, command):
    """What command prints in each CT of the gang, for a failure's message."""
    return "\n".join(f"{host}: {gang.sh(host, command, check=False)}" for host in CTS)


def test_1_rank_0_saving_alone_is_judged_once_the_whole_gang_has_stopped(gang):
    """The common pattern: rank 0 saves, the other ranks leave on KeyboardInterrupt at once, so
    ct401's stop ends before ct400's rank 0 has renamed its checkpoint into place: here the save
    lands only once ct401's stop has ended (on a loaded machine ct401's ranks took longer to go
    than a 10 s save). The gang's checkpoint is judged on every CT once every CT has stopped:
    make stop, make start and a make restart whose stop would have raced all succeed, and the
    relaunch resumes from it."""
    # the fixture launched the run the next stop meets (ALONE)
    gang.sh("ct400", f"rm -f {RELEASE_SAVE}")
    gang.sh("ct401", "rm -f /run/dflash/stop.result.json")
    stopping = gang.start("stop", ALONE)
    try:  # ct401's own stop ends (its result written), then rank 0's save may land
        gang.live.wait_in_ct("gn2", 401, "test -s /run/dflash/stop.result.json", 300, "ct401's stop did not end",
                             lambda: in_each_ct(gang, "cat /run/dflash/stop.progress.json /run/dflash/redeploy.lock; "
                                                      "ps -eo pid,stat,etime,args"))
    finally:
        gang.sh("ct400", f"touch {RELEASE_SAVE}")
    res = gang.finish(stopping)
    assert res.returncode == 0, res.stdout[-6000:]
    saved = re.search(rf"ok: \[ct400\] => msg: '?stopped PID \d+ at stage 1 \(SIGINT\) in [0-9.]+s; new checkpoint "
                      rf"({CKPT}/step_\d+)", res.out).group(1)
    # ct401's stop saw no new checkpoint, or an older save of rank 0 that completed before the
    # signal (its report ends at the next host's or task's line: the two CTs report in either order)
    ct401 = re.search(r"ok: \[ct401\] => msg: '?stopped PID \d+ at stage 1 \(SIGINT\) in [0-9.]+s; (.*?)"
                      r"(?= ok: \[| TASK \[)", res.out)
    assert ct401 and saved not in ct401.group(1), res.out
    # the gang names its one checkpoint, and the CT whose stop ended early
    assert re.search(rf"gang {GANG} \(2 CTs\): stop signalled together .*?, checkpoint {saved} "
                     r"\(ct401: its own stop ended before that save was complete\)", res.out), res.out
    assert all(gang.run(host) == (None, []) for host in CTS)
    res = gang.make("start", ALONE)
    assert res.returncode == 0, res.stdout[-6000:]
    assert f"resumed from {saved}" in gang.sh("ct400", "cat /workspace/logs/train.log")
    res = gang.make("restart", ALONE)
    assert res.returncode == 0, res.stdout[-6000:]
    checkpoint = re.search(rf"checkpoint ({CKPT}/step_\d+) \(0 steps lost\), every CT running", res.out)
    assert checkpoint and checkpoint.group(1) != saved, res.out
    assert f"resumed from {checkpoint.group(1)}" in gang.sh("ct400", "cat /workspace/logs/train.log")


def test_2_a_gang_whose_stop_phase_failed_runs_again_from_its_checkpoint(gang, tmp_path):
    """The run of test 1 saves for 10 s on SIGINT; a ladder that sends SIGTERM after 1 s cuts that
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


def test_3_a_dflash_shaped_gang_whose_torch_only_dflash_env_finds_runs_one_rank_per_ct(gang):
    """DFlash's own trainer is one process over a CT's GPUs: nproc_per_node 1 on CTs that give
    the run 2 GPUs is valid, and the report says each rank drives 2 GPUs. trainer_run_python is
    the CT's bare python3 and torch comes from the PYTHONPATH the run's environment sets, as the
    run itself finds it: the preflight's probe finds it the same way."""
    # where torch is, found without importing it (an import costs about 1.5 s of CPU)
    site = os.path.dirname(os.path.dirname(gang.sh(
        "ct400", f"{TORCH_PYTHON} -c 'import importlib.util; print(importlib.util.find_spec(\"torch\").origin)'").strip()))
    dflash_shaped = {"trainer_run_python": "/usr/bin/python3",
                     "dflash_env": {"PYTHONUNBUFFERED": "1", "PYTHONPATH": site},
                     "trainer_run_launcher_options": {"nproc_per_node": 1}}
    assert "No module named 'torch'" in gang.sh("ct400", "/usr/bin/python3 -c 'import torch' 2>&1 || true")
    res = gang.make("restart", dflash_shaped)
    assert res.returncode == 0, res.stdout[-6000:]
    for rank, host in enumerate(CTS):
        assert re.search(rf"{host} \(rank {rank}\): PID \d+, 1 ranks \(2 GPU\(s\) each\) healthy after", res.out), res.out
        agent, workers = gang.run(host)
        assert agent and len(workers) == 1, (host, res.out)
        assert "/usr/bin/python3" in gang.sh(host, f"tr '\\0' ' ' < /proc/{agent}/cmdline")
    refused = gang.make("check", {"trainer_run_launcher_options": {"nproc_per_node": 3}})
    assert refused.returncode != 0
    assert "nproc_per_node: 3 ranks do not divide the 2 GPUs the run is given" in refused.out, refused.out


def test_4_a_rank_blocked_in_a_collective_brings_the_whole_gang_back_from_its_newest_checkpoint(gang):
    """ct401's rank (one in each CT) blocks for ever in a C call (the fault file's hang-in-c: a hung
    NCCL collective); ct400's rank then waits in gloo's all_reduce for it, a C call too, where no
    Python signal handler runs. rank 0's CT (ct400) finds the gang's hang and stops its run as a hang
    (SIGINT's grace the run's cadence, then SIGTERM); ct401's supervisor stops its member when
    ct400's end appears. Both relaunch into one rendezvous from the gang's newest complete
    checkpoint, the steps lost stated."""
    fault = "/run/dflash-test-fault"
    res = gang.make("restart", {"trainer_launch_supervise_hang_floor_s": 3, "trainer_launch_supervise_hang_factor": 3,
                                "dflash_extra_args": ["--save-interval", "40"], "trainer_run_launcher_options": {"nproc_per_node": 1},
                                "dflash_env": {"PYTHONUNBUFFERED": "1", "DFLASH_TEST_FAULT_FILE": fault}})
    assert res.returncode == 0, res.stdout[-6000:]

    old = {host: gang.run(host) for host in CTS}
    rounds = {host: gang.supervisor(host)["round"] for host in CTS}
    deadline = time.monotonic() + 60
    while not ((gang.supervisor("ct400").get("learned") or {}).get("timeout_s") and "step_" in gang.sh("ct400", f"ls {CKPT}")):
        assert time.monotonic() < deadline, "no learned hang timeout and checkpoint on ct400"
        time.sleep(1.0)
    gang.sh("ct401", f"echo hang-in-c > {fault}")
    states = gang.back_whole(old, rounds, ranks=1)
    hung = states["ct400"]["ends"][-1]
    assert hung["kind"] == "hang" and hung["cause"].startswith("hung: no progress line"), hung
    assert re.search(r"; no checkpoint from its stop: \d+ steps since step_\d+ lost$", hung["stop"]), hung
    # 0 when the hang came at the step of a periodic save (every 40 steps; it blocks at a tenth step)
    assert hung["steps_lost"] >= 0 and hung["relaunch"].endswith(f"resumed from {hung['checkpoint']}"), hung
    assert states["ct401"]["ends"][-1]["kind"] in ("peer", "crash"), states["ct401"]["ends"][-1]
    assert f"resumed from {hung['checkpoint']}" in gang.sh("ct400", "tail -n 40 /workspace/logs/train.log")
