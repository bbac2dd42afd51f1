"""An unprivileged CT, as Proxmox creates one unless told otherwise, on the testbed's ct300: its root is
uid 100000 on the node (the default id map, ``lxc.idmap = u 0 100000 65536``), its rootfs owned
through the map, ``pct push`` creating files as its mapped root (pve-container's pct.pm), and two
mount points from the node - /mnt/node-owned, which the node's root owns (``nobody`` in the CT, which
cannot write it), and /mnt/ct-owned, handed to the CT's root as the node sees it (uid 100000).

The paths every other file runs on ct300 (the redeploy, the stop and its checkpoint rules, the
failed launch's rollback, the Proxmox hook, a dead controller) run in this CT too; these tests show
what is particular to it: the CT really is unprivileged (and the privileged ct200 is named as such),
a checkpoint directory it cannot write is
refused by name before the trainer is touched, and one on the mount point handed to it keeps the
stop's checkpoint and the resume."""

import os
import re

import pytest

from testlib import END_RUNS, REPO, make

CT, NODE, VMID = "ct300", "pve2", "300"
REDEPLOY = f"{REPO}/redeploy.yml"
NODE_OWNED, CT_OWNED = "/mnt/node-owned/checkpoints", "/mnt/ct-owned/checkpoints"


def sh(testbed, command, check=True):
    return testbed.in_ct(NODE, VMID, command, check=check, timeout=120)


def trainer_pids(testbed):
    return sh(testbed, "pgrep -f 'train_dflash_pipeline[.]py' || true").stdout.split()


def on_node(testbed, path_in_ct):
    """The path, in the CT's rootfs or a mount point's source, as the node sees it."""
    ctdir = f"{testbed.bed.node_dir(NODE)}/lxc/{VMID}"
    for line in open(f"{ctdir}/config", encoding="utf-8"):
        entry = line.split("=", 1)[1].split() if line.startswith("lxc.mount.entry") else []
        if entry and path_in_ct.startswith("/" + entry[1] + "/"):
            return entry[0] + path_in_ct[len(entry[1]) + 1:]
    return f"{ctdir}/rootfs{path_in_ct}"


@pytest.fixture(scope="module")
def running(testbed):
    """ct300 running the example trainer on the testbed's settings; afterwards its runs ended and the
    mount points emptied."""
    sh(testbed, END_RUNS, check=False)
    sh(testbed, "mkdir -p /dev/shm/models/target /workspace/data && echo '{}' > /dev/shm/models/target/config.json "
                "&& echo text > /workspace/data/c.txt")
    launched = testbed.playbook(REDEPLOY, "-l", CT, check=False)
    assert launched.returncode == 0, launched.stdout[-3000:]
    yield
    sh(testbed, END_RUNS, check=False)
    sh(testbed, f"rm -rf {CT_OWNED}", check=False)


def test_1_the_ct_is_unprivileged_as_proxmox_builds_one(testbed, running):
    assert sh(testbed, "cat /proc/self/uid_map").stdout.split() == ["0", "100000", "65536"]
    assert "unprivileged: 1" in testbed.ssh(NODE, f"pct config {VMID}", check=True).stdout
    # make status says what the node's configuration says; a preflight warns of the privileged ct200,
    # and refuses it when asked, before anything is touched
    status = " ".join(make("status", f"HOST=ct200:{CT}").stdout.split())
    assert re.search(r"ct200.*privileged: '?YES: its root is root on the node", status), status[-3000:]
    assert re.search(rf"{CT}.*privileged: '?no \(unprivileged", status), status[-3000:]
    checked = make("check", "HOST=ct200", extra={"trainer_preflight_privileged": "refuse"})
    flat = " ".join(checked.stdout.split()) + " ".join(checked.stderr.split())
    assert "ct200: a privileged CT - its root is the node's root" in flat, flat[-3000:]
    assert "unprivileged: a privileged CT: its root is the node's root (trainer_preflight_privileged=refuse" in flat
    assert checked.returncode != 0 and re.search(r"ct200\s+: .*failed=1", checked.stdout), flat[-3000:]
    pid = trainer_pids(testbed)[0]
    # the trainer is root in the CT and uid 100000 on the node
    assert sh(testbed, f"stat -c %u /proc/{pid}").stdout.strip() == "0"
    host_pid = testbed.ssh(NODE, f"lxc-info -P {testbed.bed.node_dir(NODE)}/lxc -n {VMID} -p -H", check=True).stdout.strip()
    with open(f"/proc/{host_pid}/status", encoding="utf-8") as handle:
        assert re.search(r"^Uid:\s+100000\s", handle.read(), re.M)
    # what pct push wrote (the release) is owned through the map; a mount point of the node's root is nobody's
    release = sh(testbed, "readlink -f /opt/dflash/current").stdout.strip()
    assert os.stat(on_node(testbed, f"{release}/train_dflash_pipeline.py")).st_uid == 100000
    assert sh(testbed, "stat -c '%U %u' /mnt/node-owned /mnt/ct-owned").stdout.split() == ["nobody", "65534",
                                                                                         "root", "0"]
    assert sh(testbed, "touch /mnt/node-owned/x", check=False).returncode != 0


def test_2_a_checkpoint_directory_the_ct_cannot_write_is_refused_before_the_trainer_is_touched(testbed, running):
    before = trainer_pids(testbed)
    pidfile = sh(testbed, "cat /run/dflash/trainer.pid").stdout
    res = make("restart", f"HOST={CT}", extra={"dflash_output_dir": NODE_OWNED})
    out = " ".join(res.stdout.split())
    assert res.returncode != 0
    assert (f"writable: dflash_output_dir {NODE_OWNED}: not writable by root in the CT: /mnt/node-owned (in "
            f"{NODE_OWNED}) is owned by nobody (65534:65534, mode 755); its owner is a node uid outside the CT's id "
            "map (0 100000 65536), on the mount point /mnt/node-owned: on the node, chown 100000:100000 its source "
            "(the CT's root as the node sees it), or map its owner into the CT with lxc.idmap") in out, out[-3000:]
    assert "not stopped" in out
    # nothing touched: the same trainer, its pidfile, no stop in its log
    assert trainer_pids(testbed) == before and sh(testbed, "cat /run/dflash/trainer.pid").stdout == pidfile
    assert "KeyboardInterrupt" not in sh(testbed, "cat /workspace/logs/train.log").stdout


def test_3_a_checkpoint_directory_on_the_mount_point_handed_to_the_ct_keeps_the_stops_checkpoint(testbed, running):
    settings = {"dflash_output_dir": CT_OWNED}
    restarted = make("restart", f"HOST={CT}", extra=settings)
    assert restarted.returncode == 0, restarted.stdout[-3000:]
    stopped = make("stop", f"HOST={CT}", extra=settings)
    out = " ".join(stopped.stdout.split())
    found = re.search(rf"checkpoint ({CT_OWNED}/step_\d+)", out)
    assert stopped.returncode == 0 and found, out[-3000:]
    assert trainer_pids(testbed) == []
    # written by the CT's root: the node sees the mapped uid
    assert {os.stat(os.path.join(top, name)).st_uid for top, dirs, files in os.walk(on_node(testbed, found.group(1)))
            for name in dirs + files} == {100000}
    started = make("start", f"HOST={CT}", extra=settings)
    assert started.returncode == 0, started.stdout[-3000:]
    assert f"resumed from {found.group(1)}" in sh(testbed, "cat /workspace/logs/train.log").stdout
    assert len(trainer_pids(testbed)) == 1
