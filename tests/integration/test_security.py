"""Security: hostile values execute nothing, secrets stay out of sight, files resist symlinks."""

import json
import os
import shlex
import subprocess

import ansible_runner

from testlib import END_RUNS, END_SUPERVISORS, REPO, TESTBED_INVENTORY, TRAINER

CT, NODE, VMID = "ct301", "pve2", "301"
REDEPLOY = os.path.join(REPO, "redeploy.yml")
SECRET = "hf_s3cr3t_7Q2xZ"
HOSTILE = ["x; touch /tmp/security-pwned1", "$(touch /tmp/security-pwned2)", "`touch /tmp/security-pwned3`",
           "'; touch /tmp/security-pwned4; '", "a\"; touch /tmp/security-pwned5; \""]


def in_ct(testbed, command, check=True):
    return testbed.in_ct(NODE, VMID, command, check=check)


def no_pwned_anywhere(testbed):
    assert in_ct(testbed, "ls /tmp /workspace /root | grep pwned", check=False).stdout == ""
    assert testbed.ssh(NODE, "ls /tmp /var/tmp /root | grep pwned").stdout == ""
    assert not any("pwned" in n for n in os.listdir("/tmp"))


def test_hostile_values_in_paths_args_env_and_file_names(testbed, tmp_path):
    in_ct(testbed, "mkdir -p /dev/shm/models/target /workspace/data && "
                   "echo '{}' > /dev/shm/models/target/config.json && echo x > /workspace/data/c")
    src = tmp_path / "src"
    src.mkdir()
    (src / "train_dflash_pipeline.py").write_text(open(TRAINER, encoding="utf-8").read())
    for index, name in enumerate(HOSTILE):  # file names in the trainer source
        (src / f"{name.replace('/', '_')}.txt").write_text(f"{index}\n")
    hostile_dir = "/workspace/out " + HOSTILE[1]  # a path value
    try:
        res = testbed.playbook(REDEPLOY, "-l", CT, "-e", json.dumps({
            "trainer_code_src": str(src),
            "dflash_output_dir": hostile_dir,
            "dflash_extra_args": ["--tag", " ".join(HOSTILE)],
            "dflash_env": {"NOTE": HOSTILE[0], "OTHER": HOSTILE[2]}}))
        assert "failed=0" in res.stdout
        listing = in_ct(testbed, "ls /opt/dflash/current/").stdout
        assert all(f"{n.replace('/', '_')}.txt" in listing for n in HOSTILE)
        assert in_ct(testbed, f"test -d {shlex.quote(hostile_dir)}", check=False).returncode == 0
        no_pwned_anywhere(testbed)
    finally:
        # the literal directory (its name has a "/tmp/security-pwned2" inside): later searches
        # for marker files must not find it (test_connection_plugin.py's `find / -name 'pwned*'`
        # walks every worker's testbed, this one's as it runs: its markers are named otherwise). The trainer this test launched writes its checkpoints
        # there, so it goes first (by the PID in its pidfile), or it would make the directory again.
        in_ct(testbed, f"{END_SUPERVISORS}; pid=$(cut -d' ' -f1 /run/dflash/trainer.pid) && kill -KILL $pid && "
                       "while kill -0 $pid 2>/dev/null; do sleep 0.05; done", check=False)
        in_ct(testbed, f"rm -rf {shlex.quote(hostile_dir.split('/tmp/')[0])}", check=False)


def test_secrets_stay_out_of_ps_logs_vvv_and_awx_artifacts(testbed, tmp_path):
    # two jobs: the second one's release is installed, so its preflight's call launches (the secret
    # in its launch option), where the first may push and launch in a call of its own
    for job in (1, 2):
        private = tmp_path / f"awx{job}"
        private.mkdir()
        run = ansible_runner.run(
            private_data_dir=str(private), playbook=REDEPLOY, project_dir=REPO,
            inventory=TESTBED_INVENTORY, limit=CT, verbosity=3,
            extravars={"dflash_secret_env": {"HF_TOKEN": SECRET}, "awx_job_id": 7,
                       "awx_user_name": "admin"}, quiet=True)
        assert run.status == "successful", run.stdout.read()
    assert any(isinstance(e["event_data"].get("res", {}).get("launch"), dict) for e in run.events
               if e["event"] == "runner_on_ok" and e["event_data"]["task"].startswith("Check GPUs, model"))
    (pid,) = in_ct(testbed, "pgrep -f train_dflash_pipeline[.]py").stdout.split()
    assert SECRET in in_ct(testbed, f"cat /proc/{pid}/environ").stdout  # it did arrive
    assert SECRET not in in_ct(testbed, "ps -eo args").stdout
    assert SECRET not in in_ct(testbed, "cat /workspace/logs/train.log /run/dflash/trainer.sh").stdout
    # env/ holds the job's inputs (the extra vars AWX was given); artifacts/ is what it produced
    found = subprocess.run(["grep", "-rl", SECRET, str(tmp_path / "awx1" / "artifacts"), str(tmp_path / "awx2" / "artifacts")],
                           capture_output=True, text=True, check=False).stdout
    assert found == "", f"secret in AWX artifacts: {found}"
    assert in_ct(testbed, "stat -c '%a %U' /run/dflash /run/dflash/secrets.env "
                          "/run/dflash/trainer.sh").stdout.split() == [
        "700", "root", "600", "root", "700", "root"]


def test_planted_symlinks_are_not_followed(testbed):
    # a run directory that is a symlink (to a world-writable place) is refused, nothing written
    in_ct(testbed, f"{END_RUNS}; "
                   "rm -rf /run/dflash /tmp/evil && mkdir -m 1777 /tmp/evil && "
                   "ln -s /tmp/evil /run/dflash")
    try:
        res = testbed.playbook(os.path.join(REPO, "playbooks", "start.yml"), "-l", CT,
                               check=False)
        assert res.returncode != 0
        assert "/run/dflash" in res.stdout
        assert in_ct(testbed, "ls -A /tmp/evil").stdout == ""
    finally:
        in_ct(testbed, "rm -f /run/dflash; rm -rf /tmp/evil")
