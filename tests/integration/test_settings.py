"""Exactly the settings the operator wrote, to exactly the CTs they named: the field's production
inventory against a testbed node (its ssh port set on the node only), strict settings, the make
targets' guard, and the per-CT lock on every playbook."""

import json
import os
import re
import shlex
import shutil
import subprocess
import time

import pytest
import yaml

from testlib import BIN, END_RUNS, END_SUPERVISORS, FIELD, REPO, task_ran, tool_env

REDEPLOY = os.path.join(REPO, "redeploy.yml")


def in_ct(testbed, node, vmid, command, check=True):
    return testbed.in_ct(node, vmid, command, check=check)


def make(*args, timeout=600):
    return subprocess.run(["make", *args], cwd=REPO, env=tool_env(), capture_output=True, text=True,
                          check=False, timeout=timeout)


def trainer_pids(testbed, node, vmid):
    return in_ct(testbed, node, vmid, "pgrep -f 'train_dflash_pipeline[.]py'", check=False).stdout.split()


@pytest.fixture
def production(testbed, tmp_path):
    """inventory/production as shipped, its node pointed at testbed node pve1: the address, the
    port (2222), the key and the known_hosts are set on the node only."""
    inventory = tmp_path / "production"
    shutil.copytree(os.path.join(REPO, "inventory", "production"), inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    bed = testbed.bed
    hosts["all"]["children"]["proxmox_nodes"]["hosts"]["pve1"] = {
        "ansible_host": bed.nodes["pve1"]["address"], "ansible_port": bed.nodes["pve1"]["port"],
        "ansible_ssh_private_key_file": bed.key,
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={bed.known_hosts} -o IdentitiesOnly=yes"}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    in_ct(testbed, "pve1", 200, END_RUNS, check=False)
    # the field's paths: the model in /dev/shm, the tokenized data, the checkpoints
    in_ct(testbed, "pve1", 200, "mkdir -p /dev/shm/Qwen3.6-27B /workspace/tokenized_completions && "
                                "echo '{}' > /dev/shm/Qwen3.6-27B/config.json && "
                                "echo tokens > /workspace/tokenized_completions/part-0")
    yield str(inventory)
    in_ct(testbed, "pve1", 200, f"{END_SUPERVISORS}; kill -KILL $(cut -d' ' -f1 /run/dflash/trainer.pid) 2>/dev/null; "
                                "rm -rf /dev/shm/Qwen3.6-27B /workspace/tokenized_completions", check=False)


def test_production_inventory_runs_the_fields_command_line(production, testbed):
    assert "ansible_port" not in yaml.safe_load(open(os.path.join(production, "hosts.yml")))["all"][
        "children"]["dflash_trainers"]["hosts"]["ct200"]  # the CT inherits its node's port
    res = testbed.playbook("-i", production, REDEPLOY, "-l", "ct200",
                           "-e", json.dumps({"trainer_run_min_free_gb": 1, "trainer_launch_health_seconds": 2}))
    assert "failed=0" in res.stdout, res.stdout
    (pid,) = trainer_pids(testbed, "pve1", 200)
    args = in_ct(testbed, "pve1", 200, f"ps -o args= -p {pid}").stdout.strip()
    # byte for byte as far as the field's record goes; --resume after it when a checkpoint is there
    assert args in (FIELD, FIELD + " --resume"), args
    summary = re.search(r"ct200: release \w+ .*?PID (\d+), (?:resumed from \S+, )?first progress after [0-9.]+s, healthy after "
                        r"[0-9.]+s, ([0-9.]+) tok/s", " ".join(res.stdout.split()))
    assert summary and summary.group(1) == pid and float(summary.group(2)) > 0


@pytest.mark.parametrize("extra,line", [
    ({"dflash_warmup_ratoi": "0.5"}, "dflash_warmup_ratoi: not a DFlash setting (a trainer flag, dflash_extra_args, "
                                     "dflash_env, dflash_secret_env or dflash_resume); did you mean dflash_warmup_ratio?"),
    ({"dflash_drafter_gpus": [4, 5]}, "dflash_drafter_gpus: GPUs [4] are also in dflash_target_gpus; the sets must be disjoint"),
    ({"dflash_lr": "fast"}, "dflash_lr: expected a number, got 'fast'"),
    ({"trainer_stop_sigint_wiat": 10}, "trainer_stop_sigint_wiat: no role of this project knows this variable; "
                                       "did you mean trainer_stop_sigint_wait?"),
    ({"trainer_stop_checkpoint_dir": "/x"}, "trainer_stop_checkpoint_dir: renamed to trainer_run_checkpoint_dir"),
    ({"trainer_run_launcher": "torchrun", "trainer_run_launcher_options": {"nprocs": 2}},
     "trainer_run_launcher_options.nprocs: torchrun has no such option"),
    ({"trainer_run_launcher": "torchrun", "trainer_run_launcher_options": {"nproc_per_node": 2},
      "trainer_launch_shutdown_timeout": 60},
     "trainer_launch_shutdown_timeout: 60 s is shorter than the stop's graceful wait cap"),
])
def test_a_bad_setting_fails_in_one_line_with_the_trainer_untouched(testbed, extra, line):
    before = trainer_pids(testbed, "pve2", 300)
    res = make("restart", "HOST=ct300", f"EXTRA=-e {shlex.quote(json.dumps(extra))}")
    assert res.returncode != 0
    assert f"[ERROR]: Task failed: Action failed: {line}" in res.stdout + res.stderr
    assert not task_ran(res.stdout, "Stop the trainer in stages")
    assert trainer_pids(testbed, "pve2", 300) == before


def test_make_targets_need_a_host_that_selects_a_trainer_ct(tmp_path):
    for target in ("restart", "stop", "start", "push", "rollback"):
        res = make(target)
        assert res.returncode == 2 and f"HOST is required: make {target} HOST=" in res.stderr, target
    res = make("restart", "HOST=pve1")  # a node, not a trainer CT
    assert res.returncode == 2 and "HOST=pve1 selects no trainer CT (group dflash_trainers)" in res.stderr
    res = make("logs", "HOST=ct20O")
    assert res.returncode == 2 and "HOST=ct20O selects no trainer CT" in res.stderr
    res = make("status", f"INVENTORY={tmp_path}/missing")  # shown as itself, not as "no host"
    assert res.returncode == 2 and "cannot be read" in res.stderr and "selects no" not in res.stderr
    res = make("help")
    assert all(word in res.stdout for word in ("NO_GRACEFUL", "EXTRA", "LINES"))


def test_a_rollback_during_a_redeploy_is_refused_and_another_ct_is_not(testbed):
    # seeded here: the test files before this one may have run on another worker's testbed
    testbed.playbook(os.path.join(REPO, "playbooks", "testbed_seed.yml"), "-e", "seed_hosts=ct300,ct301")
    # the redeploy holds ct301's lock through its launch's health watch (30 s: the calls below take
    # seconds each under load)
    redeploy = subprocess.Popen([os.path.join(BIN, "ansible-playbook"), REDEPLOY, "-l", "ct301",
                                 "-e", "trainer_launch_health_seconds=30"], cwd=REPO, env=tool_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        lock = ""
        while '"phase": "launch"' not in lock:
            assert time.monotonic() < deadline and redeploy.poll() is None
            time.sleep(0.2)
            lock = in_ct(testbed, "pve2", 301, "cat /run/dflash/redeploy.lock", check=False).stdout
        # read now: under load the health watch may end, and the lock go, before the calls below do
        holder = json.loads(lock)["holder"]
        refused = make("rollback", "HOST=ct301")
        assert refused.returncode != 0
        # the controller's words from the lock's fields, the CT's quoted as its word; its worker is
        # alive, so no command to take it over is given
        assert f"ct301: the CT is being redeployed by '{holder}' (as its lock file says) since " in refused.stdout, \
            refused.stdout[-3000:]
        assert "last phase 'launch'" in refused.stdout and "Now in this CT, as it says: 'the trainer PID" in refused.stdout
        assert "is alive and keeps the lease" in refused.stdout and "-e redeploy_lock_takeover=" not in refused.stdout
        status = make("status", "HOST=ct301")
        assert re.search(r"locked_by: .*ansible-playbook pid \d+, phase launch", status.stdout), status.stdout
        other = make("stop", "HOST=ct300")  # another CT: its own lock
        assert other.returncode == 0, other.stdout + other.stderr
        assert redeploy.wait(timeout=300) == 0, redeploy.stdout.read()
    finally:
        if redeploy.poll() is None:
            redeploy.kill()
