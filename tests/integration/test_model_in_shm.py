"""The model staged into /dev/shm from its persistent copy, on the testbed (ct201): after a CT
restart, refused when it does not fit or a bystander holds it, restaged when a shard changed, a
cut copy never at the target and the rerun converging, bad settings refused before anything is
touched. The CT's /dev/shm is a real tmpfs charged to its real memory cgroup (cgroup v1 on these
machines), whose limit the pct stand-in sets as Proxmox does (pct set --memory)."""

import json
import os
import re
import shlex
import subprocess
import time

import pytest

from testlib import BIN, END_RUNS, REPO, task_ran, tool_env

CT, NODE, VMID = "ct201", "pve1", "201"
REDEPLOY = os.path.join(REPO, "redeploy.yml")
STATUS = os.path.join(REPO, "playbooks", "status.yml")
START = os.path.join(REPO, "playbooks", "start.yml")
TARGET, SOURCE = "/dev/shm/models/target", "/workspace/models/target"
SHARDS = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
SHARD_BYTES = 64 * 1000 * 1000
SETTINGS = {"trainer_model_stage": {TARGET: SOURCE}, "trainer_model_stage_reserve_gb": 0.05,
            "trainer_run_min_free_gb": 0.1, "trainer_launch_health_seconds": 1}
# A safetensors file (huggingface/safetensors, the format's spec): an 8-byte little-endian header
# length, the JSON header naming each tensor's dtype, shape and byte range, then the bytes.
WRITE_SHARD = r"""
import json, struct, sys
path, size, fill = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
header += b" " * (-len(header) % 8)
with open(path, "wb") as out:
    out.write(struct.pack("<Q", len(header)) + header)
    block = bytes([fill]) * (1 << 20)
    for start in range(0, size, len(block)):
        out.write(block[:min(len(block), size - start)])
"""


def sh(testbed, command, check=True):
    return testbed.in_ct(NODE, VMID, command, check=check, timeout=120)


def write_shard(testbed, name, size, fill):
    sh(testbed, f"python3 -c {shlex.quote(WRITE_SHARD)} {SOURCE}/{name} {size} {fill}")


def seal(testbed):
    """The persistent copy's manifest: sha256sum over its shards, as a model hub's *.sha256."""
    sh(testbed, f"cd {SOURCE} && sha256sum {' '.join(SHARDS)} > model.sha256")


def redeploy(testbed, *extra, check=True, **settings):
    return testbed.playbook(REDEPLOY, "-l", CT, "-e", json.dumps({**SETTINGS, **settings}), *extra, check=check)


def trainer_pid(testbed):
    return sh(testbed, "cut -d' ' -f1 /run/dflash/trainer.pid", check=False).stdout.strip()


def sums(testbed, directory):
    return sh(testbed, f"cd {directory} && sha256sum {' '.join(SHARDS)}").stdout


def staged_whole(testbed):
    """Whether every shard at the target is its persistent copy's, byte for byte: cmp reads both at
    memory speed, where sha256sum took 0.9 s of CPU over the 192 MB of each side."""
    compare = "; ".join(f"cmp -s {SOURCE}/{name} {TARGET}/{name}; echo $?" for name in SHARDS)
    statuses = sh(testbed, compare).stdout.split()
    assert set(statuses) <= {"0", "1"} and len(statuses) == len(SHARDS), statuses  # 2: a shard missing
    return statuses == ["0"] * len(SHARDS)


def ct_init_pid(testbed):
    """The CT's init as the host sees it: its /proc/<pid>/root is the CT's file system."""
    return int(testbed.ssh(NODE, f"lxc-info -P {testbed.bed.node_dir(NODE)}/lxc -n {VMID} -p -H", check=True)
               .stdout.strip())


@pytest.fixture(scope="module")
def restarted(testbed):
    """ct201 just restarted (its /dev/shm empty), with the data and a persistent model of three
    safetensors shards, an index and a sha256 manifest."""
    testbed.ssh(NODE, f"pct stop {VMID}", check=False)
    testbed.ssh(NODE, f"pct start {VMID}", check=True)
    sh(testbed, f"rm -rf {SOURCE} /workspace/checkpoints /run/dflash && mkdir -p {SOURCE} /workspace/data && "
                f"echo text > /workspace/data/c.txt && echo '{{\"model_type\": \"qwen3\"}}' > {SOURCE}/config.json")
    for number, name in enumerate(SHARDS):
        write_shard(testbed, name, SHARD_BYTES, number)
    index = {"metadata": {"total_size": 3 * SHARD_BYTES}, "weight_map": {f"layer{i}": n for i, n in enumerate(SHARDS)}}
    sh(testbed, f"echo {shlex.quote(json.dumps(index))} > {SOURCE}/model.safetensors.index.json")
    seal(testbed)
    yield
    sh(testbed, END_RUNS, check=False)  # the runs' supervisors first
    testbed.ssh(NODE, f"pct set {VMID} --memory 4096", check=False)
    sh(testbed, f"rm -rf {SOURCE} /dev/shm/models /run/dflash /workspace/checkpoints", check=False)


def test_1_a_restarted_ct_gets_its_model_staged_then_launched(testbed, restarted):
    assert sh(testbed, "ls -A /dev/shm").stdout.strip() == ""  # wiped by the restart
    res = redeploy(testbed)
    staged = re.search(rf"model {TARGET} staged from {SOURCE}: 0\.2 GB in ([0-9.]+)s \((\d+) MB/s, 4 streams\), "
                       r"verified by SHA-256 of 3 files \(model\.sha256\), the 3 shards of "
                       r"model\.safetensors\.index\.json, names and sizes", " ".join(res.stdout.split()))
    assert staged, res.stdout
    assert re.search(r"PID \d+, first progress after", res.stdout)
    assert staged_whole(testbed)
    assert sh(testbed, "ls -A /dev/shm/models").stdout.split() == ["target"]  # nothing left beside it
    assert "running" in sh(testbed, f"ps -o stat= -p {trainer_pid(testbed)} && echo running").stdout

    status = testbed.playbook(STATUS, "-l", CT, "-e", json.dumps(SETTINGS))
    assert f"model {TARGET} matches {SOURCE} (6 files, 0.2 GB)" in " ".join(status.stdout.split())

    again = redeploy(testbed)  # the model matches: nothing staged, the stop and the launch in one call
    assert not task_ran(again.stdout, "Stage the model into shared memory from its persistent copy")
    assert not task_ran(again.stdout, "Stop the trainer in stages")
    assert "staged" not in again.stdout.split("Report the redeploy of this CT")[1]


def test_2_a_changed_shard_that_does_not_fit_is_refused_then_restaged(testbed, restarted):
    pid = trainer_pid(testbed)
    write_shard(testbed, SHARDS[2], SHARD_BYTES + 4096, 7)  # a new revision of one shard
    seal(testbed)
    # a limit that leaves less than the model beside what the CT holds now (the trainer and the
    # model in /dev/shm): refused before a byte is copied, the running trainer untouched
    held = int(sh(testbed, "echo $(( $(cat /sys/fs/cgroup/memory/memory.usage_in_bytes) - "
                           "$(sed -n 's/^total_inactive_file //p' /sys/fs/cgroup/memory/memory.stat) ))").stdout)
    testbed.ssh(NODE, f"pct set {VMID} --memory {held // 2 ** 20 + 100}", check=True)
    try:
        res = redeploy(testbed, check=False)
    finally:
        testbed.ssh(NODE, f"pct set {VMID} --memory 4096", check=True)
    text = " ".join(res.stdout.split())
    assert res.returncode != 0
    assert re.search(rf"model {TARGET} does not fit: it needs 0\.2 GB plus a reserve of 0\.1 GB for the trainer's "
                     r"own memory \(trainer_model_stage_reserve_gb\), and the CT can take 0\.[0-9] GB \(memory "
                     r"cgroup v1: limit [0-9.]+ GB, in use [0-9.]+ GB", text), text
    assert trainer_pid(testbed) == pid and not task_ran(res.stdout, "Stop the trainer in stages")
    assert sh(testbed, "ls -A /dev/shm/models").stdout.split() == ["target"]  # nothing copied
    assert sh(testbed, f"stat -c %s {TARGET}/{SHARDS[2]}").stdout.strip() != str(SHARD_BYTES + 4096 + 80)

    check = redeploy(testbed, "--check")  # says what it would stage, and that it fits
    text = " ".join(check.stdout.split())
    assert re.search(rf"model {TARGET} differs: {SHARDS[2]}: \d+ bytes, not \d+; model.sha256: changed in the "
                     rf"persistent copy at [0-9: -]+ UTC: 0\.2 GB to stage from {SOURCE}, fits", text), text
    assert trainer_pid(testbed) == pid

    res = redeploy(testbed)  # stopped, restaged, launched: never replaced under the running trainer
    # one call, the CT's worker: the stop, the staging after it, the launch
    assert not task_ran(res.stdout, "Stop the trainer in stages")
    assert not task_ran(res.stdout, "Stage the model into shared memory from its persistent copy")
    assert f"model {TARGET} staged from {SOURCE}" in " ".join(res.stdout.split())
    assert staged_whole(testbed)
    assert trainer_pid(testbed) not in ("", pid)


def test_3_a_model_a_bystander_holds_is_not_replaced(testbed, restarted):
    pid = trainer_pid(testbed)
    write_shard(testbed, SHARDS[0], SHARD_BYTES, 9)
    seal(testbed)
    # a process that is not the trainer (an evaluation, a shell) holds a shard open
    holder = sh(testbed, f"setsid sh -c 'exec sleep 300 < {TARGET}/{SHARDS[1]}' > /dev/null 2>&1 & echo $!").stdout.strip()
    try:
        res = redeploy(testbed, check=False)
    finally:
        sh(testbed, f"kill -KILL {holder}", check=False)
    text = " ".join(res.stdout.split())
    assert res.returncode != 0
    assert re.search(rf"model {TARGET} is in use by PID {holder} \(sleep 300\), which is not the trainer this job "
                     "stops: it is not replaced under them", text), text
    assert trainer_pid(testbed) == pid
    assert not staged_whole(testbed)  # left as it was

    # make start stops nothing: with the trainer running, its model is not staged
    res = testbed.playbook(START, "-l", CT, "-e", json.dumps(SETTINGS), check=False)
    assert res.returncode != 0
    assert (f"model_stage: a model is to be staged and the trainer PID {pid} runs (this job does not stop it: "
            "`make restart` stops it, then stages the model)") in " ".join(res.stdout.split()), res.stdout
    assert trainer_pid(testbed) == pid and not staged_whole(testbed)


def test_4_a_cut_copy_never_stands_at_the_target_and_the_rerun_converges(testbed, restarted):
    before = sums(testbed, TARGET)
    init = ct_init_pid(testbed)
    staging = f"/proc/{init}/root/dev/shm/models/.target.staging"
    job = subprocess.Popen([os.path.join(BIN, "ansible-playbook"), REDEPLOY, "-l", CT, "-e",
                            json.dumps({**SETTINGS, "trainer_model_stage_workers": 1})],
                           cwd=REPO, env=tool_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cut = None
    try:
        deadline = time.monotonic() + 120
        while cut is None and time.monotonic() < deadline and job.poll() is None:
            copied = sum(os.path.getsize(os.path.join(staging, n)) for n in os.listdir(staging)) \
                if os.path.isdir(staging) else 0
            if copied > 0:  # the copy is under way: the module copying dies, as on a lost session
                cut = [int(p) for p in os.listdir("/proc") if p.isdigit() and copying_in_ct(int(p), init)]
                for module_pid in cut:
                    os.kill(module_pid, 9)
            time.sleep(0.005)
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert cut, out
    assert job.returncode != 0
    # the target still holds the complete model of before; the cut copy lies beside it
    assert sums(testbed, TARGET) == before
    assert ".target.staging" in sh(testbed, "ls -A /dev/shm/models").stdout
    # the worker that owned the redeploy died with its copy, after its stop ended the run: the
    # rescue relaunches the release of before on the model of before (whole at the target), and
    # the report says so - never a run left down unsaid
    text = " ".join(out.split())
    assert re.search(r"launch failed, rolled back to \w+: PID \d+ running again", text), text[-3000:]
    assert re.search(r"the detached launch \(PID \d+\) ended without leaving a result", text), text[-3000:]
    assert trainer_pid(testbed)

    res = redeploy(testbed)
    assert f"model {TARGET} staged from {SOURCE}" in " ".join(res.stdout.split())
    assert staged_whole(testbed)
    assert sh(testbed, "ls -A /dev/shm/models").stdout.split() == ["target"]
    assert trainer_pid(testbed)


def test_6_a_controller_killed_during_the_copy_leaves_the_worker_to_stage_and_launch(testbed, restarted):
    """The copy after the stop runs in the CT's worker that owns the redeploy: the controller's
    whole process group killed while it copies (ours, by the group we started) changes nothing -
    the model is staged whole, the run launched on it, and the CT says that its controller did
    not see the end."""
    write_shard(testbed, SHARDS[1], SHARD_BYTES, 11)
    seal(testbed)
    pid = trainer_pid(testbed)
    init = ct_init_pid(testbed)
    staging = f"/proc/{init}/root/dev/shm/models/.target.staging"
    job = subprocess.Popen([os.path.join(BIN, "ansible-playbook"), REDEPLOY, "-l", CT, "-e",
                            json.dumps({**SETTINGS, "trainer_model_stage_workers": 1})], cwd=REPO, env=tool_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (os.path.isdir(staging) and os.listdir(staging)):
            assert time.monotonic() < deadline and job.poll() is None, "the copy was never seen"
            time.sleep(0.005)
        os.killpg(job.pid, 9)
        job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
    # the fork that ran the task outlives the playbook's group (a session of its own): it tells the CT
    testbed.wait_in_ct(NODE, VMID, "! test -e /run/dflash/launch.worker && grep -q '\"controller\": \"gone\"' "
                       "/var/lib/dflash/last-change.json", 120, "the worker's end, told its controller is gone")
    record = json.loads(sh(testbed, "cat /var/lib/dflash/last-change.json").stdout)
    assert record["failed"] is False, record
    assert staged_whole(testbed)
    assert trainer_pid(testbed) not in ("", pid) and f"PID {trainer_pid(testbed)} healthy" in record["outcome"]
    status = " ".join(testbed.playbook(STATUS, "-l", CT, "-e", json.dumps(SETTINGS)).stdout.split())
    assert "finished without its controller" in status and f"model {TARGET} matches" in status, status[-3000:]


def copying_in_ct(pid, init):
    """Whether pid, a process of the CT whose init is init, holds a file of the copy open."""
    try:
        if os.stat(f"/proc/{pid}/root").st_ino != os.stat(f"/proc/{init}/root").st_ino:
            return False
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/models/.target.staging/"):
                return True
        except OSError:
            continue
    return False


def test_5_bad_settings_are_refused_before_anything_is_touched(testbed, restarted):
    pid = trainer_pid(testbed)
    sh(testbed, "mkdir -p /workspace/not-a-model /workspace/models/drafter && echo '{}' > /workspace/models/drafter/config.json")
    res = redeploy(testbed, check=False, trainer_model_stage={
        TARGET: "/workspace/models/nowhere", "/dev/shm/models/extra": "/workspace/not-a-model",
        "/workspace/models/drafter-copy": "/workspace/models/drafter"})
    text = " ".join(res.stdout.split())
    assert res.returncode != 0
    assert f"{TARGET} from /workspace/models/nowhere: the persistent copy /workspace/models/nowhere does not exist" in text
    assert "/dev/shm/models/extra from /workspace/not-a-model: /workspace/not-a-model is not a model directory (no config.json)" in text
    assert ("/workspace/models/drafter-copy from /workspace/models/drafter: /workspace/models/drafter-copy is not in "
            "/dev/shm or another tmpfs (it is on") in text
    assert trainer_pid(testbed) == pid and not task_ran(res.stdout, "Stop the trainer in stages")
    sh(testbed, "rm -rf /workspace/not-a-model /workspace/models/drafter")
