"""The example trainer inside a real CT, launched as playbooks/testbed_seed.yml does."""

import os
import time

from testlib import END_RUNS, REPO

CT, NODE, VMID = "ct300", "pve2", "300"
SEED = os.path.join(REPO, "playbooks", "testbed_seed.yml")


def in_ct(testbed, command, check=True):
    return testbed.ssh(NODE, f"pct exec {VMID} -- sh -c '{command}'", check=check)


def test_seeded_trainer_runs_checkpoints_on_sigint_and_resumes(testbed):
    in_ct(testbed, END_RUNS, check=False)  # the runs' supervisors first
    in_ct(testbed, "rm -rf /workspace/checkpoints /workspace/logs/train.log", check=False)
    try:
        res = testbed.playbook(SEED, "-e", f"seed_hosts={CT}")
        assert "failed=0" in res.stdout
        res = testbed.playbook(SEED, "-e", f"seed_hosts={CT}")  # a running trainer is left alone
        assert "changed=0" in res.stdout

        pid = in_ct(testbed, "pgrep -f train_dflash_pipeline[.]py").stdout.split()
        assert len(pid) == 1
        status = in_ct(testbed, f"cat /proc/{pid[0]}/status").stdout
        sig_ign = int(next(line for line in status.splitlines()
                           if line.startswith("SigIgn:")).split()[1], 16)
        assert not sig_ign & (1 << 1), "SIGINT ignored: the launch made a background job"
        stat = in_ct(testbed, f"cat /proc/{pid[0]}/stat").stdout.rsplit(")", 1)[1].split()
        assert stat[2] == stat[3] == pid[0]  # own process group and session

        in_ct(testbed, f"kill -INT {pid[0]}")
        deadline = time.monotonic() + 30
        while in_ct(testbed, f"test -d /proc/{pid[0]}", check=False).returncode == 0:
            assert time.monotonic() < deadline, "trainer did not stop on SIGINT"
            time.sleep(0.1)
        latest = in_ct(testbed, "cat /workspace/checkpoints/latest").stdout.strip()
        assert in_ct(testbed, f"test -f /workspace/checkpoints/{latest}/COMPLETE",
                     check=False).returncode == 0

        testbed.playbook(SEED, "-e", f"seed_hosts={CT}")  # relaunch with --resume
        deadline = time.monotonic() + 30
        while "resumed from" not in in_ct(testbed, "cat /workspace/logs/train.log").stdout:
            assert time.monotonic() < deadline, "relaunched trainer did not resume"
            time.sleep(0.2)
        assert f"/workspace/checkpoints/{latest}" in in_ct(testbed, "cat /workspace/logs/train.log").stdout
    finally:  # the trainers this test started, inside the CT, by PID
        in_ct(testbed, END_RUNS, check=False)  # the runs' supervisors first
