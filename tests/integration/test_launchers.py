"""Runs started by torchrun, accelerate and the DeepSpeed launcher, for real, in a testbed CT (the
torch venv of `make venv-torch`, bound into the CTs): the example trainer's ranks join a gloo
process group through the launcher's own rendezvous, rank 0 logs and saves, and on an interrupt
the other ranks wait for its save in a barrier.

1. a run started by hand (`nohup torchrun ... &`) whose interrupt save takes longer than torchrun's
   default 30 s deadline: the stop holds the agent and signals the workers, the checkpoint is
   written and complete, nothing is left running, no restart;
2. `redeploy.yml` with `trainer_run_launcher: torchrun`: the launch makes the agent safe (no
   restart, a deadline of the stop's graceful cap), every rank is healthy; the next redeploy stops
   it through the agent alone and resumes from the checkpoint;
3. accelerate (several processes: its own process is the agent) and the DeepSpeed launcher
   (SIGTERM to its workers, which save on SIGINT: the stop signals them itself).
"""

import os
import re
import shlex

import ansible_runner
import pytest

from testlib import END_RUNS, REPO, TESTBED_INVENTORY, TRAINER

CT, NODE, VMID = "ct301", "pve2", "301"
VENV = os.path.join(REPO, ".venv-torch")
PYTHON = os.path.join(VENV, "bin", "python")
OUT, LOG = "/workspace/checkpoints", "/workspace/logs/train.log"
ARGS = (f"--target-model /dev/shm/models/target --data-dir /workspace/data --output-dir {OUT} "
        "--target-gpus 0,1 --drafter-gpus 2,3 --profile-interval 20 --save-interval 1000")
SAVE_SECONDS = 35  # longer than torchrun's default deadline (30 s)


def sh(testbed, command, check=True):
    return testbed.in_ct(NODE, VMID, command, check=check)


def trainers(testbed):
    return sh(testbed, "pgrep -f 'train_dflash_pipeline[.]py'", check=False).stdout.split()


def clean(testbed):
    sh(testbed, END_RUNS, check=False)  # the runs' supervisors first
    sh(testbed, f"rm -rf {OUT} /run/dflash/trainer.pid /workspace/logs && mkdir -p {OUT} /workspace/logs")


@pytest.fixture(scope="module")
def ct(testbed):
    if sh(testbed, f"test -x {PYTHON} && ip link show lo | grep -q LOWER_UP", check=False).returncode:
        # started before the torch venv existed, or by an older testbed: a restart binds the venv
        # and brings the loopback up
        testbed.ssh(NODE, f"pct stop {VMID} && pct start {VMID}", check=True)
    # found, not imported: importing the three costs about 3.5 s of CPU, and the launches below import them
    found = "import importlib.util as u; assert all(u.find_spec(m) for m in ('torch', 'accelerate', 'deepspeed'))"
    assert sh(testbed, f'{PYTHON} -c "{found}"', check=False).returncode == 0
    sh(testbed, "mkdir -p /dev/shm/models/target /workspace/data && echo '{}' > /dev/shm/models/target/config.json "
                "&& echo 'a b c d e f g h' > /workspace/data/corpus.txt")
    testbed.ssh(NODE, f"pct push {VMID} {TRAINER} /root/train_dflash_pipeline.py", check=True)
    clean(testbed)
    yield testbed
    clean(testbed)


def wait_for(testbed, text, timeout=90, count=1):
    """Until count lines of the run's log hold text."""
    testbed.wait_in_ct(NODE, VMID, f"[ $(grep -cF {shlex.quote(text)} {LOG}) -ge {count} ]", timeout,
                       f"{count} lines with {text!r}", lambda: sh(testbed, f"cat {LOG}", check=False).stdout[-3000:])


def playbook(tmp_path, name, **extravars):
    """A playbook of the project, as AWX runs it: {task name: result} of the CT."""
    private = tmp_path / f"runner-{name.replace('/', '-')}-{len(os.listdir(tmp_path))}"
    private.mkdir()
    run = ansible_runner.run(private_data_dir=str(private), playbook=os.path.join(REPO, name), project_dir=REPO,
                             inventory=TESTBED_INVENTORY, limit=CT,
                             extravars=extravars, quiet=True)
    results = {e["event_data"]["task"]: e["event_data"]["res"] for e in run.events
               if e["event"] in ("runner_on_ok", "runner_on_failed") and e["event_data"].get("host") == CT}
    assert run.status == "successful", run.stdout.read()[-5000:]
    return results


def launched_with(launcher, options, env=None):
    return {"trainer_run_launcher": launcher, "trainer_run_launcher_options": options,
            "trainer_run_python": PYTHON, "trainer_run_script": "/opt/dflash/current/train_dflash_pipeline.py",
            "dflash_env": dict({"PYTHONUNBUFFERED": "1", "DFLASH_STEP_SECONDS": "0.02"}, **(env or {})),
            "dflash_target_gpus": [0, 1], "dflash_drafter_gpus": [2, 3], "dflash_profile_interval": 20}


def interrupted_at(testbed, log):
    return int(re.findall(r"KeyboardInterrupt at step (\d+): saving", sh(testbed, f"cat {log}").stdout)[-1])


def check_stopped(testbed, stop, launcher, plan, log=LOG):
    """The stop of a launcher's run (log: the stopped run's): through the plan expected, the
    checkpoint the interrupt wrote, nothing lost, left or restarted, each rank's end named."""
    launch = stop["launcher"]
    assert launch["launcher"] == launcher and launch["plan"]["to"] == plan, launch
    assert stop["checkpoint"]["written"] and stop["checkpoint"]["new_step"] == interrupted_at(testbed, log), stop["msg"]
    assert stop["checkpoint"]["resume"]["complete"] and stop["loss"]["steps_lost"] == 0, stop["msg"]
    assert not launch.get("restarted"), launch
    assert all(rank["ended_by"] for rank in launch["ranks"]) and len(launch["ranks"]) == 2, launch["ranks"]
    return launch


def test_1_a_hand_started_torchrun_whose_save_outlasts_its_deadline_is_stopped_with_its_checkpoint(ct, tmp_path):
    env = (f"PYTHONUNBUFFERED=1 DFLASH_STEP_SECONDS=0.02 DFLASH_TEST_SLOW_CHECKPOINT_SECONDS={SAVE_SECONDS} "
           "DFLASH_TEST_SLOW_SAVES=interrupt")
    sh(ct, f"cd /workspace && bash -c 'env {env} nohup {VENV}/bin/torchrun --standalone --nproc_per_node 2 "
           f"/root/train_dflash_pipeline.py {ARGS} > {LOG} 2>&1 < /dev/null &'")
    wait_for(ct, "tok/s")
    stop = playbook(tmp_path, "playbooks/stop.yml", trainer_run_checkpoint_dir=OUT,
                    trainer_run_log_file=LOG)["Stop the trainer in stages"]
    launch = check_stopped(ct, stop, "torchrun", "workers")
    assert trainers(ct) == []
    assert launch["deadline_s"] == 30 and "default" in launch["deadline"], launch
    held = [e for e in stop["timeline"] if e["event"] in ("held", "signal", "released")]
    assert [e["event"] for e in held][:3] == ["held", "signal", "released"], held
    assert held[1]["signal"] == "SIGINT" and sorted(held[1]["pids"]) == sorted(launch["workers"])
    assert held[2]["elapsed"] - held[1]["elapsed"] >= SAVE_SECONDS, held  # the save outlived 30 s


def test_2_a_torchrun_launch_is_safe_for_the_stop_and_resumes_with_every_rank(ct, tmp_path):
    settings = launched_with("torchrun", {"nproc_per_node": 2, "standalone": True},
                             {"DFLASH_TEST_SLOW_CHECKPOINT_SECONDS": "5", "DFLASH_TEST_SLOW_SAVES": "interrupt"})
    first = playbook(tmp_path, "redeploy.yml", **settings)["Start the trainer and wait until it is healthy"]
    assert first["launcher"]["ranks"] == 2 and len(first["launcher"]["workers"]) == 2, first["launcher"]
    assert first["launcher"]["deadline_s"] == 900 and "--shutdown-timeout" in first["launcher"]["deadline"]
    argv = first["argv"]
    assert argv[:4] == [PYTHON, "-u", "-m", "torch.distributed.run"] and "--max-restarts" in argv, argv
    wait_for(ct, "tok/s", count=5)
    again = playbook(tmp_path, "redeploy.yml", **settings)
    # a CT that runs alone: the stop ran in the launch's own call, before the new run started
    assert "Stop the trainer in stages" not in again
    stop = again["Start the trainer and wait until it is healthy"]["stop"]
    check_stopped(ct, stop, "torchrun", "agent", log=LOG + ".1")  # the relaunch rotated it
    signalled = [e for e in stop["timeline"] if e["event"] == "signal"]
    assert signalled[0]["pids"] == [first["pid"]] and signalled[0]["scope"] == "agent", signalled
    relaunch = again["Start the trainer and wait until it is healthy"]
    assert relaunch["resume"]["step"] == stop["checkpoint"]["new_step"] and len(relaunch["launcher"]["workers"]) == 2
    assert f"resumed from {stop['checkpoint']['new']} at step {stop['checkpoint']['new_step']}" in sh(
        ct, f"cat {LOG}").stdout


@pytest.mark.parametrize("launcher,options,env,plan", [
    ("accelerate", {"multi_gpu": True, "num_processes": 2, "num_machines": 1, "mixed_precision": "no",
                    "dynamo_backend": "no"}, {}, "agent"),
    ("deepspeed", {"num_gpus": 2}, {"DS_ACCELERATOR": "cpu"}, "workers"),
])
def test_3_accelerate_and_deepspeed_by_their_rules(ct, tmp_path, launcher, options, env, plan):
    clean(ct)
    settings = launched_with(launcher, options, env)
    first = playbook(tmp_path, "redeploy.yml", **settings)["Start the trainer and wait until it is healthy"]
    assert len(first["launcher"]["workers"]) == 2, first["launcher"]
    wait_for(ct, "tok/s", count=3)
    stop = playbook(tmp_path, "playbooks/stop.yml", **settings)["Stop the trainer in stages"]
    launch = check_stopped(ct, stop, launcher, plan)
    assert trainers(ct) == []
    if launcher == "deepspeed":  # the runner forwards nothing, launch.py would send SIGTERM
        assert "does not forward it" in launch["plan"]["why"] and "hard-coded" in launch["deadline"]
        assert len(launch["holders"]) == 2
    else:
        assert launch["deadline_s"] == 900 and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in launch["deadline"], launch
