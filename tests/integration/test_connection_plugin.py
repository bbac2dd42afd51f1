"""The dflash.lifecycle.pct connection plugin, through real SSH and real pct exec."""

import os
import subprocess

import testinfra

from testlib import BIN, REPO, TESTBED_INVENTORY, run_tool, tool_env

HERE = os.path.dirname(os.path.abspath(__file__))
CT, NODE, VMID = "ct201", "pve1", "201"


def test_ping(testbed):
    res = testbed.ansible(CT, "-m", "ansible.builtin.ping")
    assert '"ping": "pong"' in res.stdout or "ping: pong" in res.stdout


def test_pipelining_one_pct_exec_per_module(testbed):
    testbed.ansible(CT, "-m", "ansible.builtin.ping")  # ControlMaster warm
    before = len(testbed.pct_invocations(NODE))
    res = testbed.ansible(CT, "-m", "ansible.builtin.ping", "-vvv")
    calls = testbed.pct_invocations(NODE)[before:]
    # pipelining: the module goes on stdin of one `pct exec`, no temp file is put
    assert [c["argv"][:4] for c in calls] == [["exec", VMID, "--", "/bin/sh"]]
    assert "PUT " not in res.stdout
    assert "pct exec 201 -- /bin/sh -c" in res.stdout


def test_playbook_copy_template_fetch_command(testbed, tmp_path):
    res = testbed.playbook(os.path.join(HERE, "files", "connection_plugin.yml"),
                           "-e", f"target={CT}", "-e", f"fetch_dir={tmp_path}")
    assert "failed=0" in res.stdout
    fetched = tmp_path / "quote's \"double\".txt"
    assert fetched.read_text() == "content of quote's \"double\".txt\n"
    # checked from the node, independently of the plugin
    listing = testbed.ssh(NODE, "pct exec 201 -- ls -1 '/tmp/conn test dir'", check=True)
    assert sorted(listing.stdout.splitlines()) == sorted([
        "dollar $undefined_var $(touch pwned).txt", "quote's \"double\".txt",
        "semi;colon `touch pwned2`.txt", "tmpl $x;'y'.conf", "with space.txt"])
    # nothing in a file name was executed, in the CT or on the node (the node's root file system
    # is the host's, clones and venvs included: a walk that takes minutes on a loaded machine)
    found = testbed.ssh(NODE, "pct exec 201 -- find / -xdev -name 'pwned*'; "
                              "find / -xdev -name 'pwned*' -newer /etc/hostname 2>/dev/null", timeout=600)
    assert found.stdout == ""


def test_stopped_ct_is_reported(testbed):
    testbed.ssh("pve2", "pct stop 301", check=True)
    try:
        res = testbed.ansible("ct301", "-m", "ansible.builtin.ping", check=False)
        assert res.returncode != 0
        # one line that says what it is, not an SSH failure ("UNREACHABLE ... Data could not be sent")
        assert "CT 301 on pve2 is stopped (pct status: stopped)" in res.stdout + res.stderr
        assert "UNREACHABLE" not in res.stdout + res.stderr
        status = subprocess.run(["make", "status", "HOST=ct301"], cwd=REPO, env=tool_env(),
                                capture_output=True, text=True, check=False)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "ct: stopped" in status.stdout and "running: false" in status.stdout
    finally:
        testbed.ssh("pve2", "pct start 301", check=True)


def test_bad_vmid_names_the_variable(testbed):
    res = run_tool([os.path.join(BIN, "ansible"), CT, "-m", "ansible.builtin.ping",
                    "-e", "ansible_pct_vmid=12"], check=False)
    assert res.returncode != 0
    assert "ansible_pct_vmid='12'" in res.stdout + res.stderr


def test_testinfra_reaches_a_ct_through_the_inventory(testbed):
    # force_ansible: testinfra cannot speak pct itself, it runs each command as a task
    host = testinfra.get_host(f"ansible://{CT}?force_ansible=True",
                              ansible_inventory=TESTBED_INVENTORY)
    assert host.check_output("hostname") == CT
    assert host.file("/workspace").is_directory
    assert host.run("nvidia-smi -L").stdout.count("GPU ") == 8
