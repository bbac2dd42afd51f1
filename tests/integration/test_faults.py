"""Fault injection: the controller's connection to the node drops in the middle of a stop."""

import os
import re
import subprocess
import time

from conftest import BIN, REPO, tool_env
from test_staged_stop import CT, NODE, OUT, ct  # noqa: F401  (fixture)

EXTRA = os.environ.get("DFLASH_FAULT_EXTRA", "").split()  # to try variants by hand


def masters_to(address, port=2222):
    """PIDs of the ssh client processes (ControlMasters) connected to address:port."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", "dst", f"{address}:{port}"],
                         capture_output=True, text=True, check=True).stdout
    return sorted({int(p) for p in re.findall(r'"ssh",pid=(\d+)', out)})


def test_stop_survives_a_dropped_controller_connection(ct, testbed):
    # a legacy launch (SIGINT ignored) with periodic checkpoints: the stop first waits for the
    # next checkpoint, and the connection is cut while it waits, before any signal was sent
    ct.launch(how="background", extra="--save-interval 300 --profile-interval 5")
    deadline = time.monotonic() + 30
    while ct.sh(f"ls {OUT} | grep -c '^step_'", check=False).stdout.strip() in ("", "0", "1"):
        assert time.monotonic() < deadline, "no periodic checkpoint history"
        time.sleep(0.2)
    (trainer,) = ct.trainer_pids()
    playbook = subprocess.Popen(
        [os.path.join(BIN, "ansible-playbook"), os.path.join(REPO, "playbooks", "stop.yml"),
         "-l", CT, "-e", f"trainer_stop_checkpoint_dir={OUT}",
         "-e", "trainer_stop_log_file=/workspace/train.log", *EXTRA],
        cwd=REPO, env=tool_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ct.sh("pgrep -f [A]nsiballZ_staged_stop", check=False).stdout.strip():
            assert time.monotonic() < deadline and playbook.poll() is None
            time.sleep(0.05)
        address = testbed.bed.nodes[NODE]["address"]
        killed = masters_to(address)
        assert killed, "no ControlMaster to the node: nothing to drop"
        for pid in killed:  # started by the playbook above: ours, ended by PID
            os.kill(pid, 9)
        assert ct.sh(f"test -d /proc/{trainer}", check=False).returncode == 0  # not yet stopped
        output = playbook.communicate(timeout=300)[0]
    finally:
        if playbook.poll() is None:
            playbook.kill()
    # whatever the controller saw, the stop ran to its end inside the CT
    deadline = time.monotonic() + 60
    while ct.trainer_pids():
        assert time.monotonic() < deadline, output
        time.sleep(0.2)
    saved = ct.sh(f"ls {OUT} | grep -c '^step_'").stdout.strip()
    assert int(saved) >= 3  # the periodic checkpoint it waited for landed before the stop
    # a rerun converges: nothing left to stop
    rerun = testbed.playbook(os.path.join(REPO, "playbooks", "stop.yml"), "-l", CT,
                             "-e", f"trainer_stop_checkpoint_dir={OUT}")
    assert "no trainer running" in rerun.stdout and "failed=0" in rerun.stdout
