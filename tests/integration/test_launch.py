"""trainer_preflight + trainer_launch on the testbed (ct300): the launch contract."""

import json
import os
import re
import shlex
import threading
import time

import pytest

from testlib import END_RUNS, REPO, example_settings

from ansible_collections.dflash.lifecycle.plugins.plugin_utils.run_settings import argv as dflash_argv  # noqa: E402

CT, NODE, VMID = "ct300", "pve2", "300"
START = os.path.join(REPO, "playbooks", "start.yml")
ACTIVATE = os.path.join(REPO, "tests", "integration", "files", "activate.yml")
SECRET = "sekrit-7f3a9c"
GPU_STATE = "/run/nvidia-testbed/state.json"  # what the testbed's nvidia-smi says the driver holds


@pytest.fixture(scope="module")
def ready(testbed):
    """ct300 with the example trainer as the current release, a model and data."""
    def in_ct(command, check=True):
        return testbed.in_ct(NODE, VMID, command, check=check)

    in_ct(END_RUNS, check=False)  # left by an interrupted earlier run, or another module's
    in_ct("mkdir -p /dev/shm/models/target /workspace/data && echo '{}' > "
          "/dev/shm/models/target/config.json && echo 'some text' > /workspace/data/c.txt")
    testbed.playbook(ACTIVATE, "-e", json.dumps({"target": CT, "trainer_code_legacy_links": []}))
    return in_ct


@pytest.fixture
def launch(testbed, ready):
    def run(*extra, check=True, **extra_vars):
        extra_vars.setdefault("trainer_run_min_free_gb", 0.1)
        extra_vars.setdefault("trainer_launch_health_seconds", 1)
        return testbed.playbook(START, "-l", CT, "-e", json.dumps(extra_vars), *extra, check=check)
    yield run
    ready(END_RUNS, check=False)  # the run's supervisor first: it would relaunch a trainer ended under it
    ready(f"rm -rf /run/dflash /workspace/checkpoints /tmp/pwned* {GPU_STATE}", check=False)


def trainer_pid(ready):
    return ready("cut -d' ' -f1 /run/dflash/trainer.pid").stdout.strip()


def test_launch_contract(launch, ready):
    res = launch()
    assert re.search(r"trainer PID \d+ healthy, [0-9.]+ tok/s", res.stdout)
    pid = trainer_pid(ready)
    start = ready("cut -d' ' -f2 /run/dflash/trainer.pid").stdout.strip()
    stat = ready(f"cat /proc/{pid}/stat").stdout.rsplit(")", 1)[1].split()
    assert stat[19] == start  # the pidfile names the Python process itself
    assert stat[2] == stat[3] == pid  # session leader of its own session and group
    args = ready(f"ps -o args= -p {pid}").stdout.strip()
    expected = dflash_argv(example_settings(), python="/usr/bin/python3",
                           script="/opt/dflash/current/train_dflash_pipeline.py")
    assert args == " ".join(expected)
    status = ready(f"cat /proc/{pid}/status").stdout
    masks = {line.split(":")[0]: int(line.split()[1], 16) for line in status.splitlines()
             if line.startswith(("SigIgn", "SigCgt"))}
    assert masks["SigCgt"] & 1 << 1 and not masks["SigIgn"] & 1 << 1  # SIGINT caught
    assert not masks["SigIgn"] & 1 << 14  # SIGTERM at its default
    assert ready(f"readlink /proc/{pid}/fd/0").stdout.strip() == "/dev/null"
    assert ready("stat -c %a /run/dflash /run/dflash/secrets.env").stdout.split() == ["700", "600"]

    again = launch(check=False)  # a second launch is refused
    assert again.returncode != 0 and f"a trainer is already running: PID {pid}" in again.stdout


def test_check_mode_shows_the_command_line_and_starts_nothing(launch, ready):
    res = launch("--check")
    assert "--noise-type uniform --use-soft-labels" in res.stdout
    assert "would start" in res.stdout
    assert ready("pgrep -f train_dflash_pipeline[.]py", check=False).stdout == ""


def test_crash_at_start_fails_with_the_log_tail(launch):
    res = launch(check=False, dflash_env={"DFLASH_TEST_CRASH_AT_START": "1"})
    assert res.returncode != 0
    assert "exited with status 1" in res.stdout
    assert "crash at start requested" in res.stdout


def test_hostile_values_execute_nothing(launch, ready, testbed):
    hostile = ["x; touch /tmp/pwned1", "$(touch /tmp/pwned2)", "`touch /tmp/pwned3`",
               "'; touch /tmp/pwned4; '"]
    res = launch(dflash_extra_args=["--save-interval", "500", "--tag", " ".join(hostile)],
                 dflash_env={"RUN_NOTE": "$(touch /tmp/pwned5)"})
    assert "healthy" in res.stdout
    pid = trainer_pid(ready)
    assert ready(f"cat /proc/{pid}/cmdline").stdout.split("\0")[-3] == " ".join(hostile)
    assert "RUN_NOTE=$(touch /tmp/pwned5)" in ready(f"cat /proc/{pid}/environ").stdout
    assert ready("ls /tmp | grep pwned", check=False).stdout == ""
    assert testbed.ssh(NODE, "ls /tmp | grep pwned").stdout == ""


def test_secrets_reach_the_trainer_only(launch, ready):
    res = launch("-v", dflash_secret_env={"WANDB_API_KEY": SECRET})
    pid = trainer_pid(ready)
    assert SECRET in ready(f"cat /proc/{pid}/environ").stdout
    assert "secrets_in_env=['WANDB_API_KEY']" in ready("cat /workspace/logs/train.log").stdout
    assert SECRET not in ready("ps -eo args").stdout
    assert SECRET not in ready("cat /workspace/logs/train.log /run/dflash/trainer.sh").stdout
    assert SECRET not in res.stdout + res.stderr


def test_preflight_missing_model_names_dev_shm(launch, ready):
    ready("mv /dev/shm/models/target /dev/shm/models/away")
    try:
        res = launch(check=False)
        assert res.returncode != 0
        assert "target_model: /dev/shm/models/target: missing" in res.stdout
        assert "wiped when the CT restarts" in res.stdout
    finally:
        ready("mv /dev/shm/models/away /dev/shm/models/target")


def test_preflight_too_few_gpus(testbed, ready):
    res = testbed.playbook(START, "-l", "ct301", "-e", json.dumps(
        {"dflash_target_gpus": [0, 1, 2, 3, 4], "dflash_drafter_gpus": [5, 6, 7]}), check=False)
    assert res.returncode != 0
    assert "gpus_visible: 4 GPUs from nvidia-smi -L (the run needs GPU ids up to 7)" in res.stdout


def test_invalid_value_stops_before_anything_is_touched(launch, ready):
    res = launch(check=False, dflash_noise_end="0.9")
    assert res.returncode != 0
    assert "dflash_noise_end: must be <= dflash_noise_start (0.3), got 0.9" in res.stdout
    assert ready("test -e /run/dflash", check=False).returncode == 1


def hold_gpu_memory(ready, mib, seconds=None):
    """The driver holds mib MiB on GPU 5 (an exited run's memory, no process listed), for
    ever or until seconds from now; returns that time by the CT's clock (0: for ever)."""
    script = ("import json, sys, time\n"
              f"until = time.time() + {seconds} if {seconds is not None} else None\n"
              f"json.dump({{'held_mib': {{'5': {mib}}}, 'held_until': until}}, open('{GPU_STATE}', 'w'))\n"
              "print(until or 0)\n")
    return float(ready(f"mkdir -p {os.path.dirname(GPU_STATE)} && python3 -c {shlex.quote(script)}").stdout)


def test_the_launch_waits_until_the_driver_freed_the_gpu_memory(launch, ready):
    hold_gpu_memory(ready, 30000)
    freed = {}

    def free_two_seconds_into_the_wait():
        deadline = time.monotonic() + 120
        while ready("test -e /run/dflash/launch.progress.json", check=False).returncode:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        freed["at"] = hold_gpu_memory(ready, 30000, seconds=2)

    helper = threading.Thread(target=free_two_seconds_into_the_wait)
    helper.start()
    try:
        res = launch()
    finally:
        helper.join()
    assert "at" in freed, "the launch never waited"
    report = " ".join(res.stdout.split())  # the yaml callback wraps long lines
    waited = re.search(r"waited ([0-9.]+)s for the GPUs to be free \(GPU 5: 30000 of 81559 MiB used "
                       r"\(threshold 1024 MiB\), no process listed by nvidia-smi", report)
    assert waited and float(waited.group(1)) >= 2.0
    # the trainer started (its pidfile written) only once the memory was freed
    written = ready("python3 -c 'import os; print(os.stat(\"/run/dflash/trainer.pid\").st_mtime)'").stdout
    assert float(written) >= freed["at"]


def test_memory_never_freed_fails_naming_the_gpu_and_starts_nothing(launch, ready):
    hold_gpu_memory(ready, 30000)
    res = launch(check=False, trainer_launch_gpu_free_timeout=3)
    assert res.returncode != 0
    # the bound waited out, however late a loaded machine's last look came
    found = re.search(r"GPUs not free after (\d+\.\d)s \(bound 3\.0s\), nothing was started: GPU 5: 30000 of "
                      r"81559 MiB used \(threshold 1024 MiB\), no process listed by nvidia-smi",
                      " ".join(res.stdout.split()))
    assert found and float(found.group(1)) >= 3.0, res.stdout
    assert ready("pgrep -f train_dflash_pipeline[.]py", check=False).stdout == ""
    assert ready("test -e /run/dflash/trainer.pid", check=False).returncode == 1


def test_a_foreign_gpu_holder_blocks_the_launch_named(launch, ready):
    ready("setsid -f sh -c 'exec 3</dev/nvidia6; exec sleep 600' < /dev/null > /dev/null 2>&1")
    holder = ready("pgrep -x -f 'sleep 600'").stdout.split()[0]
    try:
        res = launch(check=False)  # refused at once ("in use", not "not free after" the wait)
        assert res.returncode != 0
        assert ("GPUs in use by other processes, nothing was started: GPU 6: 2048 of 81559 MiB used "
                f"(threshold 1024 MiB), nvidia-smi lists PID {holder} (2048 MiB); /dev/nvidia6 held by "
                f"PID {holder} (sleep 600)") in res.stdout
        assert ready("pgrep -f train_dflash_pipeline[.]py", check=False).stdout == ""
    finally:
        ready(f"kill -KILL {holder}", check=False)
