"""trainer_code role on the testbed (ct301): releases, checksums, compile gate, rollback."""

import json
import os
import subprocess
import time

import pytest

from testlib import END_SUPERVISORS, REPO, TRAINER

CT, NODE, VMID = "ct301", "pve2", "301"
BASE = "/opt/dflash-test"
PUSH = os.path.join(REPO, "playbooks", "push.yml")
ROLLBACK = os.path.join(REPO, "playbooks", "rollback.yml")
ACTIVATE = os.path.join(REPO, "tests", "integration", "files", "activate.yml")
SEED = os.path.join(REPO, "playbooks", "testbed_seed.yml")


@pytest.fixture
def code(testbed, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train_dflash_pipeline.py").write_text(open(TRAINER, encoding="utf-8").read())
    (src / "my config.yaml").write_text("lr: 6e-4\n")
    for index in range(3):
        (src / f"helper_{index}.py").write_text(f"VALUE = {index}\n")

    def in_ct(command, check=True):
        return testbed.in_ct(NODE, VMID, command, check=check)

    def run(*extra, playbook=PUSH, check=True, **overrides):
        extra_vars = {"trainer_code_src": str(src), "trainer_run_release_base": BASE,
                      "trainer_code_legacy_links": [
                          {"path": "/root/legacy_train.py", "target": "train_dflash_pipeline.py"}],
                      **overrides}
        before = testbed.pct_invocations(NODE)
        res = testbed.playbook(playbook, "-l", CT, "-e", json.dumps(extra_vars), *extra,
                               check=check)
        calls = testbed.pct_invocations(NODE)[len(before):]
        res.pushes = sum(1 for c in calls if c["argv"][0] == "push")
        res.execs = sum(1 for c in calls if c["argv"][0] == "exec")
        return res

    def activate():
        return run(playbook=ACTIVATE)

    in_ct(f"rm -rf {BASE} /root/legacy_train.py*")
    yield type("Code", (), {"src": src, "run": staticmethod(run), "in_ct": staticmethod(in_ct),
                            "activate": staticmethod(activate)})
    in_ct(f"rm -rf {BASE} /root/legacy_train.py*", check=False)


def current(code):
    return code.in_ct(f"readlink {BASE}/current", check=False).stdout.strip()


def test_first_push_then_no_change_then_one_file(code):
    first = code.run()
    assert first.pushes == 1 and "changed=" in first.stdout
    listing = code.in_ct(f"ls {BASE}/releases/*/").stdout
    assert "my config.yaml" in listing and "train_dflash_pipeline.py" in listing
    assert current(code) == ""  # pushed, not activated

    again = code.run()
    assert again.pushes == 0 and again.execs == 2  # the status read, and the unlock of push.yml
    assert "changed=0" in again.stdout

    (code.src / "helper_1.py").write_text("VALUE = 'changed'\n")
    changed = code.run()
    assert changed.pushes == 1
    assert "helper_1.py" in changed.stdout  # reported as modified
    assert len(code.in_ct(f"ls {BASE}/releases").stdout.split()) == 2


def test_activate_rollback_and_legacy_link(code, testbed):
    # rollback.yml stops the trainer, switches back, preflights and relaunches: the CT needs
    # what a seeded one has (the model in /dev/shm, data), whatever ran before this test
    testbed.playbook(SEED, "-e", f"seed_hosts={CT}")
    code.run()
    code.activate()
    first = current(code)
    assert first.startswith("releases/")
    link = code.in_ct("readlink /root/legacy_train.py").stdout.strip()
    assert link == f"{BASE}/current/train_dflash_pipeline.py"
    (code.src / "helper_0.py").write_text("VALUE = 'second'\n")
    code.run()
    code.activate()
    second = current(code)
    assert second != first
    assert code.in_ct(f"readlink {BASE}/previous").stdout.strip() == first
    try:
        code.run(playbook=ROLLBACK, trainer_run_script=f"{BASE}/current/train_dflash_pipeline.py")
        assert current(code) == first
        assert code.in_ct(f"cat {BASE}/current/helper_0.py").stdout == "VALUE = 0\n"
        relaunched = code.in_ct("cut -d' ' -f1 /run/dflash/trainer.pid").stdout.strip()
        assert f"{BASE}/current/train_dflash_pipeline.py" in code.in_ct(f"ps -o args= -p {relaunched}").stdout
    finally:  # the relaunched trainer runs from BASE, which the fixture removes
        code.in_ct(f"{END_SUPERVISORS}; kill -KILL $(cut -d' ' -f1 /run/dflash/trainer.pid)", check=False)


def test_syntax_error_leaves_trainer_and_current_alone(code):
    code.run()
    code.activate()
    before = current(code)
    code.in_ct(f"mkdir -p /workspace/ck-code && cd /workspace && setsid -f python3 -u "
               f"{BASE}/current/train_dflash_pipeline.py --target-model /m --data-dir /workspace "
               "--output-dir /workspace/ck-code --target-gpus 0,1 --drafter-gpus 2 "
               "> /workspace/code-train.log 2>&1 < /dev/null")
    time.sleep(1)
    pid = code.in_ct(f"pgrep -f {BASE}/current/train_dflash_pipeline[.]py").stdout.strip()
    try:
        (code.src / "broken.py").write_text("def ok():\n    return 1\ndef broken(:\n")
        res = code.run(check=False)
        assert res.returncode != 0
        assert "compile gate failed" in res.stdout and "broken.py:3:" in res.stdout
        assert current(code) == before
        assert code.in_ct(f"pgrep -f {BASE}/current/train_dflash_pipeline[.]py").stdout.strip() == pid
        assert code.in_ct(f"ls -a {BASE}/releases").stdout.count(".tmp-") == 0
    finally:
        code.in_ct(f"{END_SUPERVISORS}; kill -KILL {pid}", check=False)


def test_check_mode_transfers_nothing(code):
    res = code.run("--check", "--diff")
    assert res.pushes == 0
    assert "train_dflash_pipeline.py" in res.stdout  # the files that would change
    assert code.in_ct(f"test -e {BASE}/releases", check=False).returncode == 1


def test_read_only_target_is_caught_by_the_checksum_step(code):
    res = code.run(check=False, trainer_code_ct_upload_dir="/usr")
    assert res.pushes == 1  # pct push ran and, like the real one, exited 0
    assert res.returncode != 0
    assert "the copy into the container failed" in res.stdout
    assert code.in_ct(f"ls {BASE}/releases 2>/dev/null | wc -l").stdout.strip() == "0"


def test_stopped_ct_fails_clearly(code, testbed):
    testbed.ssh(NODE, f"pct stop {VMID}", check=True)
    try:
        res = code.run(check=False)
        assert res.returncode != 0
        assert f"CT {VMID} on {NODE} is stopped (pct status: stopped)" in res.stdout
        assert res.pushes == 0
    finally:
        testbed.ssh(NODE, f"pct start {VMID}", check=True)


def test_git_ref_source_gives_the_same_release(code, tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["cp", "-r", str(code.src), str(repo)], check=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "code"], check=True)
    from_dir = code.run()
    from_git = code.run(trainer_code_git_repo=str(repo), trainer_code_git_ref="HEAD")
    assert from_git.pushes == 0  # same content, same release: nothing to push
    assert from_dir.pushes == 1


def test_keep_prunes_old_releases_but_not_current(code):
    code.run()
    code.activate()
    active = current(code)
    for index in range(3):
        (code.src / "helper_2.py").write_text(f"VALUE = {index + 10}\n")
        code.run(trainer_code_keep=1)
    kept = code.in_ct(f"ls {BASE}/releases").stdout.split()
    assert len(kept) == 2 and active.split("/")[1] in kept
