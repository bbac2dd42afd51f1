"""A CT that moved to another node (`pct migrate`, as HA or maintenance does): the static map
fails plainly, naming the CT and the node, and the cluster inventory (dflash.lifecycle.pve_cluster,
`pvesh get /cluster/resources` over the nodes' root SSH) finds it where it is, with its releases
and checkpoints as they were; a node that does not answer is skipped."""

import json
import os
import shutil
import subprocess

import pytest
import yaml

from testlib import BIN, END_RUNS, REPO, TESTBED_INVENTORY, tool_env

CT, VMID, HOME_NODE, OTHER_NODE = "ct200", "200", "pve1", "pve2"
REDEPLOY = os.path.join(REPO, "redeploy.yml")


def in_ct(testbed, node, command, check=True):
    return testbed.in_ct(node, VMID, command, check=check)


def playbook(*args):
    return subprocess.run([os.path.join(BIN, "ansible-playbook"), *args], cwd=REPO, env=tool_env(),
                          capture_output=True, text=True, check=False)


def make(*args):
    return subprocess.run(["make", *args], cwd=REPO, env=tool_env(), capture_output=True, text=True, check=False)


def model_back(testbed, node):
    """/dev/shm is a tmpfs: a migration restarts the CT, and the model must be copied back."""
    in_ct(testbed, node, "mkdir -p /dev/shm/models/target && echo '{}' > /dev/shm/models/target/config.json")


@pytest.fixture(scope="module")
def moved(testbed, tmp_path_factory):
    """ct200 with a release and a checkpoint, stopped, then migrated from pve1 to pve2."""
    in_ct(testbed, HOME_NODE, END_RUNS, check=False)  # the runs' supervisors first
    model_back(testbed, HOME_NODE)
    in_ct(testbed, HOME_NODE, "mkdir -p /workspace/data && echo 'a b c d' > /workspace/data/corpus.txt")
    assert playbook(REDEPLOY, "-l", CT).returncode == 0
    stopped = playbook(os.path.join(REPO, "playbooks", "stop.yml"), "-l", CT)
    assert stopped.returncode == 0, stopped.stdout
    before = in_ct(testbed, HOME_NODE, "readlink /opt/dflash/current; ls /workspace/checkpoints").stdout
    migrated = testbed.ssh(HOME_NODE, f"pct migrate {VMID} {OTHER_NODE} --restart")
    assert migrated.returncode == 0 and "migration finished successfully" in migrated.stdout, migrated.stderr
    model_back(testbed, OTHER_NODE)
    try:
        yield {"before": before, "inventory": cluster_inventory(testbed, tmp_path_factory.mktemp("cluster"))}
    finally:
        in_ct(testbed, OTHER_NODE, END_RUNS, check=False)  # the runs' supervisors first
        testbed.ssh(OTHER_NODE, f"pct migrate {VMID} {HOME_NODE} --restart", check=True)
        model_back(testbed, HOME_NODE)


def cluster_inventory(testbed, root):
    """inventory/testbed with its CTs found by the cluster, not listed: the nodes (a third one
    first, where nothing answers), the group_vars, ct301's own settings as host_vars."""
    inventory = root / "inventory"
    shutil.copytree(TESTBED_INVENTORY, inventory)
    static = yaml.safe_load((inventory / "hosts.yml").read_text())
    nodes = static["all"]["children"]["proxmox_nodes"]["hosts"]
    nodes["pve0"] = {"ansible_host": "127.77.0.9"}  # no sshd there: a node that is down
    trainers = static["all"]["children"].pop("dflash_trainers")["hosts"]
    (inventory / "hosts.yml").write_text(yaml.safe_dump(static))
    (inventory / "host_vars").mkdir()
    for host, variables in trainers.items():
        own = {k: v for k, v in variables.items() if k not in ("pve_node", "ansible_pct_vmid")}
        if own:
            (inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(own))
    (inventory / "pve_cluster.yml").write_text(yaml.safe_dump(
        {"plugin": "dflash.lifecycle.pve_cluster", "nodes": ["pve0", "pve1", "pve2"], "tag": "dflash",
         "connect_timeout": 3}))
    return str(inventory)


def test_a_stale_static_map_names_the_ct_and_the_node_in_one_line(moved):
    res = make("status", f"HOST={CT}")
    out = " ".join(res.stdout.split())
    assert res.returncode == 0 and "UNREACHABLE" not in out, out
    assert (f"CT {VMID} is not on {HOME_NODE} (pct: Configuration file 'nodes/{HOME_NODE}/lxc/{VMID}.conf' does "
            "not exist): it may have moved to another node") in out
    assert f"ct: not on {HOME_NODE}" in out
    restart = make("restart", f"HOST={CT}")
    lines = [line for line in restart.stdout.splitlines() if f"CT {VMID} is not on {HOME_NODE} (pct:" in line]
    assert restart.returncode != 0 and "UNREACHABLE" not in restart.stdout and lines, restart.stdout


def test_the_cluster_inventory_finds_the_ct_where_it_runs_now(moved):
    res = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", moved["inventory"], "--list"], cwd=REPO,
                         env=tool_env(), capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    # what the cluster answered is data, not a template: ansible-inventory marks it unsafe
    found = json.loads(res.stdout, object_hook=lambda o: o.get("__ansible_unsafe", o))
    assert sorted(found["dflash_trainers"]["hosts"]) == ["ct200", "ct201", "ct300", "ct301"]
    hostvars = found["_meta"]["hostvars"]
    assert (hostvars[CT]["pve_node"], hostvars[CT]["ansible_pct_vmid"]) == (OTHER_NODE, int(VMID))
    assert hostvars["ct301"]["dflash_target_gpus"] == [0, 1]  # host_vars still apply by name
    assert "node pve0 did not answer" in res.stderr  # down: the next node answered


def test_a_redeploy_of_the_moved_ct_finds_its_releases_and_checkpoint(moved, testbed):
    res = make("restart", f"HOST={CT}", f"INVENTORY={moved['inventory']}")
    out = " ".join(res.stdout.split())
    assert res.returncode == 0, out
    current, *checkpoints = moved["before"].split()
    assert in_ct(testbed, OTHER_NODE, "readlink /opt/dflash/current").stdout.strip() == current
    release = current.split("/")[-1]
    assert f"{CT}: release {release} (installed already)" in out
    newest = max(checkpoints, key=lambda name: int(name.split("_")[-1]) if name.startswith("step_") else -1)
    assert f"resumed from /workspace/checkpoints/{newest}" in out, out


def test_the_cluster_inventory_fails_naming_each_node_when_none_answers(moved, tmp_path):
    inventory = tmp_path / "inventory"
    shutil.copytree(moved["inventory"], inventory)
    config = inventory / "pve_cluster.yml"
    config.write_text(config.read_text().replace("- pve1\n- pve2\n", ""))
    # the job fails (ansible.cfg: any_unparsed_is_failed), it does not run on the CTs left
    res = playbook("-i", str(inventory), REDEPLOY, "-l", CT)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode != 0 and "PLAY RECAP" not in out, out
    assert "no node of ['pve0'] answered: pve0: exit 255: ssh: connect to host 127.77.0.9" in out, out
