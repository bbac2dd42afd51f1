"""The testbed comes up, goes down without leftovers, and cleans up after a killed up.

These tests use their own instance (own state dir, own loopback addresses) so
that the default testbed, possibly running `make demo`, is never touched.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from testlib import REPO, tool_env

import testbed as testbed_mod

TESTBED = os.path.join(REPO, "tests", "testbed", "testbed.py")


def write_inventory(path, state_dir, octet):
    path.mkdir()
    (path / "hosts.yml").write_text(f"""---
all:
  vars:
    testbed_state_dir: {state_dir}
  children:
    proxmox_nodes:
      vars:
        ansible_port: 2222
      hosts:
        n1: {{ansible_host: 127.77.{octet}.1}}
        n2: {{ansible_host: 127.77.{octet}.2}}
    dflash_trainers:
      hosts:
        t1: {{pve_node: n1, ansible_pct_vmid: 500}}
        t2: {{pve_node: n1, ansible_pct_vmid: 501}}
        t3: {{pve_node: n2, ansible_pct_vmid: 600, testbed_gpu_count: 2}}
        t4: {{pve_node: n2, ansible_pct_vmid: 601}}
""")
    return str(path)


def cli(inventory, action):
    return subprocess.run([sys.executable, TESTBED, "-i", inventory, action], env=tool_env(),
                          capture_output=True, text=True, check=False, timeout=300)


def our_processes(state_dir):
    """PIDs whose command line mentions this instance's state dir."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and state_dir in testbed_mod.read_cmdline(int(entry)):
            found.append(int(entry))
    return found


def listening(address, port=2222):
    with socket.socket() as sock:
        return sock.connect_ex((address, port)) == 0


def assert_nothing_left(bed, state_dir, octet):
    assert not os.path.exists(state_dir)
    assert our_processes(state_dir) == []
    assert not listening(f"127.77.{octet}.1") and not listening(f"127.77.{octet}.2")
    for name in bed.nodes:
        res = subprocess.run(["lxc-ls", "-P", bed.pct_node(name).lxcpath],
                             capture_output=True, text=True, check=False)
        assert res.stdout.strip() == ""


@pytest.fixture
def instance(tmp_path):
    state_dir = f"/var/lib/dflash-testbed/pytest-{os.getpid()}-{tmp_path.name}"
    octet = 100 + os.getpid() % 100
    inventory = write_inventory(tmp_path / "inventory", state_dir, octet)
    yield inventory, state_dir, octet
    cli(inventory, "down")  # whatever happened above


def test_up_down_up(instance):
    inventory, state_dir, octet = instance
    assert cli(inventory, "up").returncode == 0
    assert cli(inventory, "up").returncode == 0  # idempotent
    bed = testbed_mod.Testbed(inventory)
    status = bed.status()
    assert all(status[n]["sshd_pid"] for n in ("n1", "n2"))
    assert status["n1"]["cts"] == {"500": True, "501": True}
    assert status["n2"]["cts"] == {"600": True, "601": True}
    assert listening(f"127.77.{octet}.1") and listening(f"127.77.{octet}.2")
    res = subprocess.run(
        ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={bed.known_hosts}",
         "-i", bed.key, "-p", "2222", f"root@127.77.{octet}.2",
         "pct list; pct exec 600 -- nvidia-smi -L"],
        capture_output=True, text=True, check=True, timeout=60)
    assert [line.split()[0] for line in res.stdout.splitlines()[1:3]] == ["600", "601"]
    assert res.stdout.count("GPU ") == 2  # testbed_gpu_count: 2

    assert cli(inventory, "down").returncode == 0
    assert_nothing_left(bed, state_dir, octet)
    assert cli(inventory, "down").returncode == 0  # idempotent

    assert cli(inventory, "up").returncode == 0
    assert testbed_mod.Testbed(inventory).status()["n2"]["cts"] == {"600": True, "601": True}


def test_down_after_killed_up(instance):
    inventory, state_dir, octet = instance
    proc = subprocess.Popen([sys.executable, TESTBED, "-i", inventory, "up"], env=tool_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bed = testbed_mod.Testbed(inventory)
    first_ct = os.path.join(bed.pct_node("n1").lxcpath, "500")
    deadline = time.monotonic() + 60
    while not bed.pct_node("n1").check_running("500") and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # mid-way: node n1 and CT 500 are up, the rest is not
    proc.wait()
    assert os.path.isdir(first_ct)
    assert our_processes(state_dir), "the killed up left nothing to clean: test is void"

    res = cli(inventory, "down")
    assert res.returncode == 0, res.stderr
    assert_nothing_left(bed, state_dir, octet)


def test_down_refuses_a_directory_it_did_not_create(tmp_path):
    state_dir = f"/var/lib/dflash-testbed/pytest-foreign-{os.getpid()}"
    inventory = write_inventory(tmp_path / "inventory", state_dir, 99)
    os.makedirs(state_dir)
    try:
        res = cli(inventory, "down")
        assert res.returncode == 1
        assert "not ours, left alone" in res.stderr
        assert os.path.isdir(state_dir)
    finally:
        os.rmdir(state_dir)


def test_up_fresh_starts_from_empty_cts_after_a_run_killed_before_its_teardown(instance):
    """A machine that stops mid-run (killed, rebooted, snapshotted) keeps the CTs' disks and ends
    their processes: what a test left there (a release, a lock, a checkpoint) must not meet the
    next run's tests, which up_fresh serves; a running instance it keeps when asked."""
    inventory, _state_dir, _octet = instance
    bed = testbed_mod.Testbed(inventory)
    bed.up()
    node = bed.pct_node("n1")
    leftover = os.path.join(node.lxcpath, "500", "rootfs", "workspace", "leftover")
    with open(leftover, "w", encoding="utf-8") as handle:
        handle.write("an earlier run's state\n")
    for name in bed.nodes:  # the processes end, the disks stay
        for vmid in os.listdir(bed.pct_node(name).lxcpath):
            assert bed.pct_node(name).lxc_stop(vmid, "--kill")
        os.kill(bed.sshd_pid(name), signal.SIGTERM)  # started by bed.up() above: ours
    deadline = time.monotonic() + 10
    while any(bed.sshd_pid(name) for name in bed.nodes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not node.check_running("500") and os.path.exists(leftover)
    bed.up_fresh()
    assert node.check_running("500") and not os.path.exists(leftover)
    # an instance that is up (make demo's, under a test session or a benchmark) is kept as it is
    with open(leftover, "w", encoding="utf-8") as handle:
        handle.write("the demo's state\n")
    bed.up_fresh(keep_running=True)
    assert os.path.exists(leftover)
