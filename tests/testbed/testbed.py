#!/usr/bin/env python3
"""Local Proxmox testbed: sshd "nodes" on loopback holding real LXC "CTs".

The layout comes from an Ansible inventory (``inventory/testbed`` by default),
so the inventory the playbooks use and the testbed can never disagree:

* ``testbed_state_dir`` (all): where this testbed instance keeps everything;
* group ``proxmox_nodes``: one sshd per host on ``ansible_host:ansible_port``;
* group ``dflash_trainers``: one CT per host, ``ansible_pct_vmid`` on node
  ``pve_node``, with ``testbed_gpu_count`` fake GPUs (default 8) and ``testbed_tags`` in its
  Proxmox config (default ``dflash``, what the cluster inventory selects by); optionally
  ``testbed_net0`` (``name=eth0,bridge=vmbr0,ip=10.77.9.1/24``: a NIC on a bridge of the
  testbed's cluster network, a network namespace of its own that no host interface is part of)
  and ``testbed_mp0`` (``<host dir>,mp=<path in the CT>``: a bind mount point, as shared
  storage gives several CTs one directory), written into the CT's Proxmox config as
  ``net0``/``mp0``; ``testbed_mp1`` likewise;
  ``testbed_unprivileged`` (true: an unprivileged CT, Proxmox's default, built as pve-container builds
  one: ``unprivileged: 1`` in its Proxmox config, the default id map in its LXC config, its rootfs
  owned through the map) and ``testbed_mapped_mounts`` (the mount points, ``mp0``/``mp1``, whose
  source directory the testbed hands to the CT's root as the node sees it, as an admin does for an
  unprivileged CT; the others stay the node root's, ``nobody`` in such a CT).

``up`` and ``down`` are idempotent.  Everything created lives under the state
dir and carries a marker; ``down`` ends only the daemons and containers it
finds there (by PID, after checking the marker), so it also cleans up after a
killed ``up`` and never touches anything else on the host.

Usage: testbed.py [-i INVENTORY] up|down|status
"""

import argparse
import re
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pct  # noqa: E402  (the stand-in: its Node class runs the CTs)

REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_INVENTORY = os.path.join(REPO, "inventory", "testbed")
MARKER = ".dflash-testbed"
SSHD = "/usr/sbin/sshd"
SYSTEM_PYTHON = "/usr/bin/python3"  # what the nodes and CTs run; not the venv
DEFAULT_GPU_COUNT = 8
DEFAULT_TAGS = "dflash"  # the tag the cluster inventory (dflash.lifecycle.pve_cluster) selects by
# PyTorch for the CTs (make venv-torch: a venv of the system python3 the CTs run), bound
# read-only at its own path, so torchrun and accelerate run in the CTs for real; optional: a CT
# started before the venv exists has none (tests/integration/test_launchers.py restarts it)
TORCH_VENV = os.path.join(REPO, ".venv-torch")
CT_INIT = "/usr/sbin/dflash-testbed-init"
CT_DIRS = ("usr", "etc", "proc", "sys", "dev", "tmp", "root", "run", "var/tmp",
           "var/log", "workspace", "opt", "home", "mnt", "local-bin")
# Mirror the host's merged-/usr symlinks so host binaries find their libraries.
USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# an unprivileged CT's id map when its config sets none: pve-container's PVE::LXC::update_lxc_config
# writes "lxc.idmap = u 0 100000 65536" and the same for g (PVE::LXC::parse_id_maps' default)
ID_MAP_BASE, ID_MAP_COUNT = 100000, 65536
MOUNT_POINTS = ("mp0", "mp1")
# cgroup v1's devices controller, where the host mounts one: there an allow rule adds to what is
# allowed; cgroup v2's rules would make LXC's device program an allow list of them alone
DEVICES_V1 = os.path.isdir("/sys/fs/cgroup/devices")


class TestbedError(Exception):
    pass


def log(message):
    print(f"testbed: {message}", flush=True)


def load_layout(inventory):
    """Nodes and CTs of the testbed, read through ansible-inventory."""
    tool = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
    res = subprocess.run([tool, "-i", inventory, "--list"],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise TestbedError(f"ansible-inventory -i {inventory} failed:\n{res.stderr}")
    data = json.loads(res.stdout)
    hostvars = data.get("_meta", {}).get("hostvars", {})
    nodes = {}
    for name in data.get("proxmox_nodes", {}).get("hosts", []):
        hv = hostvars[name]
        nodes[name] = {"address": hv["ansible_host"], "port": int(hv.get("ansible_port", 22)),
                       "cts": {}}
    state_dirs = {hv.get("testbed_state_dir") for hv in hostvars.values()}
    if len(state_dirs) != 1 or None in state_dirs:
        raise TestbedError(f"{inventory}: set testbed_state_dir once, for all hosts")
    for name in data.get("dflash_trainers", {}).get("hosts", []):
        hv = hostvars[name]
        node = hv.get("pve_node")
        if node not in nodes:
            raise TestbedError(f"{name}: pve_node={node!r} is not in group proxmox_nodes")
        vmid = str(hv.get("ansible_pct_vmid"))
        if not re.match(pct.VMID_RE, vmid):
            raise TestbedError(f"{name}: ansible_pct_vmid={vmid!r} is not a valid VM ID")
        nodes[node]["cts"][vmid] = {
            "hostname": name, "gpus": int(hv.get("testbed_gpu_count", DEFAULT_GPU_COUNT)),
            "tags": hv.get("testbed_tags", DEFAULT_TAGS),
            "net0": hv.get("testbed_net0"), "mp0": hv.get("testbed_mp0"), "mp1": hv.get("testbed_mp1"),
            "unprivileged": bool(hv.get("testbed_unprivileged", False)),
            "mapped_mounts": list(hv.get("testbed_mapped_mounts") or [])}
    for name, node in nodes.items():
        if not node["address"].startswith("127."):
            raise TestbedError(f"{name}: testbed nodes must live on loopback (127.0.0.0/8)")
    return state_dirs.pop(), nodes


@contextlib.contextmanager
def instance_lock(state_dir, remove=False):
    """Serialises up/down of one instance; remove=True (down) leaves no lock file behind."""
    parent = os.path.dirname(state_dir.rstrip("/"))
    os.makedirs(parent, mode=0o755, exist_ok=True)
    path = os.path.join(parent, f".{os.path.basename(state_dir)}.lock")
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if remove:
                os.unlink(path)
                with contextlib.suppress(OSError):
                    os.rmdir(parent)  # only when no other instance lives there


PCT_ENTRY = """\
\"\"\"pct on a testbed node: the stand-in beside it (pct.py, from tests/testbed/pct.py).\"\"\"
import sys

import pct

sys.exit(pct.main(sys.argv[1:]))
"""


def run(cmd, check=True, **kwargs):
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if check and res.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def write(path, text, mode=0o644):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, mode)


def remove_tree(path):
    """shutil.rmtree, letting a file vanish under it: an ssh master of the tests (ControlPath in
    the state directory) removes its own socket as it exits when its node's sshd goes down."""
    def gone_already(_function, _path, error):
        if not isinstance(error, FileNotFoundError):
            raise error

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=gone_already)
    else:
        shutil.rmtree(path, onerror=lambda function, name, info: gone_already(function, name, info[1]))


def read_cmdline(pid):
    """The command line as one string (sshd rewrites its argv into a title)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def children_of(pid):
    """Direct and indirect children of pid (walking PPid in /proc)."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    parent_of[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [p for p, pp in parent_of.items() if pp == current]
        found.extend(kids)
        frontier.extend(kids)
    return found


class Testbed:
    def __init__(self, inventory=DEFAULT_INVENTORY):
        self.inventory = inventory
        self.state_dir, self.nodes = load_layout(inventory)
        self.key = os.path.join(self.state_dir, "id_ed25519")
        self.known_hosts = os.path.join(self.state_dir, "known_hosts")
        self.ssh_config = os.path.join(self.state_dir, "ssh_config")

    def node_dir(self, node):
        return os.path.join(self.state_dir, "nodes", node)

    def pct_node(self, node):
        return pct.Node(self.node_dir(node))

    # -- up ------------------------------------------------------------------------
    def up(self):
        with instance_lock(self.state_dir):
            os.makedirs(self.state_dir, mode=0o755, exist_ok=True)
            write(os.path.join(self.state_dir, MARKER), f"inventory: {self.inventory}\n")
            if not os.path.exists(self.key):
                run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dflash-testbed",
                     "-f", self.key])
            known = []
            self.up_cluster_network()
            for name, spec in self.nodes.items():
                known.append(self.up_node(name, spec))
                for vmid, ct in spec["cts"].items():
                    self.up_ct(name, vmid, ct)
            write(self.known_hosts, "".join(known))
            write(self.ssh_config, "".join(f"Host {spec['address']}\n    Port {spec['port']}\n"
                                           for spec in self.nodes.values()))
            self.write_members()
        log(f"up: {len(self.nodes)} nodes, "
            f"{sum(len(n['cts']) for n in self.nodes.values())} CTs, state in {self.state_dir}")

    def running(self):
        """Whether this instance is up: every node's sshd runs."""
        return os.path.isdir(self.state_dir) and all(self.sshd_pid(name) for name in self.nodes)

    def up_fresh(self, keep_running=False):
        """Bring the instance up from nothing: what an earlier one left at state_dir (a run
        killed before its own teardown leaves CT disks holding its releases, locks and
        checkpoints) is taken down first, so tests start from the same empty CTs anywhere.
        keep_running: an instance that is up (make demo's) is used as it is."""
        if not (keep_running and self.running()):
            self.down()
        self.up()

    def up_cluster_network(self):
        """The cluster network: a network namespace of this instance holding every bridge a CT's
        net0 names (the nodes' vmbrN, joined as a switch would join them). No host interface is
        in it and nothing in it routes out: CT-to-CT traffic stays in namespaces the testbed made."""
        bridges = {pct.parse_property_string(ct["net0"])["bridge"] for node in self.nodes.values()
                   for ct in node["cts"].values() if ct["net0"]}
        if not bridges:
            return
        netns = pct.cluster_netns(self.state_dir)
        if netns not in run(["ip", "netns", "list"]).stdout.split():
            run(["ip", "netns", "add", netns])
        for bridge in sorted(bridges):
            if run(["ip", "-n", netns, "link", "show", bridge], check=False).returncode != 0:
                run(["ip", "-n", netns, "link", "add", bridge, "type", "bridge"])
            run(["ip", "-n", netns, "link", "set", bridge, "up"])

    def up_node(self, name, spec):
        ndir = self.node_dir(name)
        for sub in ("bin", "lxc", "lock", "root", f"etc/pve/nodes/{name}/lxc"):
            os.makedirs(os.path.join(ndir, sub), mode=0o755, exist_ok=True)
        os.chmod(os.path.join(ndir, "root"), 0o700)
        # a node's 'local' dir storage, holding snippets as a node's own /var/lib/vz does once
        # snippets are added to its content (the testbed's nodes share one file system: the
        # path is under the node's directory)
        os.makedirs(os.path.join(ndir, "var/lib/vz/snippets"), mode=0o755, exist_ok=True)
        if not os.path.exists(os.path.join(ndir, "etc/pve/storage.cfg")):
            write(os.path.join(ndir, "etc/pve/storage.cfg"),
                  f"dir: local\n\tpath {ndir}/var/lib/vz\n\tcontent iso,vztmpl,backup,snippets\n")
        write(os.path.join(ndir, "root", ".bashrc"), "export HOME=/root\n")
        # One copy of pct (and pvesh) per node: it finds its node from its own location. pct runs
        # thousands of times a test run: bin/pct imports the stand-in (bin/pct.py, compiled here by
        # the nodes' Python) rather than run it as a script, which Python compiles at every call
        # (6 ms of a pct exec's 40 ms of CPU; -S another 4 ms: it needs nothing of site-packages)
        shutil.copyfile(os.path.join(HERE, "pct.py"), os.path.join(ndir, "bin", "pct.py"))
        run([SYSTEM_PYTHON, "-m", "py_compile", os.path.join(ndir, "bin", "pct.py")])
        write(os.path.join(ndir, "bin", "pct"), f"#!{SYSTEM_PYTHON} -S\n{PCT_ENTRY}", 0o755)
        shutil.copyfile(os.path.join(HERE, "pvesh.py"), os.path.join(ndir, "bin", "pvesh"))
        os.chmod(os.path.join(ndir, "bin", "pvesh"), 0o755)
        # a cluster's nodes reach each other as root over SSH (pvecm puts every node's key in the
        # cluster's authorized_keys): the testbed's nodes get an ssh on their PATH that uses the
        # testbed's key and known_hosts, which every node's sshd accepts, and the testbed's
        # ssh_config, which gives each node's address its sshd's port as a cluster's port 22
        write(os.path.join(ndir, "bin", "ssh"),
              f"#!/bin/sh\nexec /usr/bin/ssh -F {self.ssh_config} -o IdentitiesOnly=yes -i {self.key} "
              f"-o UserKnownHostsFile={self.known_hosts} \"$@\"\n", 0o755)
        host_key = os.path.join(ndir, "ssh_host_ed25519_key")
        if not os.path.exists(host_key):
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", host_key])
        shutil.copyfile(self.key + ".pub", os.path.join(ndir, "authorized_keys"))
        os.chmod(os.path.join(ndir, "authorized_keys"), 0o600)
        config = os.path.join(ndir, "sshd_config")
        path = f"{ndir}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        write(config, "\n".join([
            f"ListenAddress {spec['address']}:{spec['port']}",
            f"HostKey {host_key}",
            f"PidFile {ndir}/sshd.pid",
            f"AuthorizedKeysFile {ndir}/authorized_keys",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes yes",
            "PrintMotd no",
            "LogLevel VERBOSE",  # one "Accepted publickey" line per connection, for the benchmarks
            "AcceptEnv LANG LC_*",
            # a Proxmox node has pct on root's PATH and Debian's default dotfiles, not this
            # host's (a pyenv init in root's .bashrc costs 0.1 s per session): bash reads the
            # node's own .bashrc, which gives the command HOME=/root back (pct exec passes
            # HOME on into the CT)
            f"SetEnv PATH={path} HOME={ndir}/root PVE_TESTBED_NODE={name}",
            "MaxSessions 64",
            "MaxStartups 64:30:128",
            "Subsystem sftp internal-sftp",
            "",
        ]))
        if self.sshd_pid(name) is None:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privsep dir
            run([SSHD, "-t", "-f", config])
            proc = subprocess.Popen([SSHD, "-D", "-f", config, "-E", f"{ndir}/sshd.log"],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            write(os.path.join(ndir, "sshd.testbed-pid"), f"{proc.pid}\n")
            self.wait_listening(name, spec, proc)
        with open(host_key + ".pub", encoding="utf-8") as handle:
            keytype, key = handle.read().split()[:2]
        # by address, and by the node's name as pvecm updatecerts keeps the cluster's known_hosts
        # (/etc/pve/priv/known_hosts): Proxmox's own SSH between nodes names the host key by the
        # node (PVE::SSHInfo: HostKeyAlias=<node>)
        return f"[{spec['address']}]:{spec['port']} {keytype} {key}\n{name} {keytype} {key}\n"

    def write_members(self):
        """Each node's /etc/pve/.members, as pmxcfs keeps it (pve-cluster src/pmxcfs/status.c): the
        cluster's nodes with their ids and addresses, this node's name first; what PVE::Cluster's
        get_members and remote_node_ip read (pvesh get /cluster/status shows it)."""
        nodelist = {name: {"id": index + 1, "online": 1, "ip": spec["address"]}
                    for index, (name, spec) in enumerate(sorted(self.nodes.items()))}
        for name in self.nodes:
            write(os.path.join(self.node_dir(name), "etc/pve/.members"), json.dumps({
                "nodename": name, "version": len(nodelist) + 1,
                "cluster": {"name": "dflash-testbed", "version": 1, "nodes": len(nodelist), "quorate": 1},
                "nodelist": nodelist}, indent=1) + "\n")

    def wait_listening(self, name, spec, proc):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                with open(os.path.join(self.node_dir(name), "sshd.log"), encoding="utf-8") as h:
                    raise TestbedError(f"sshd of node {name} exited: {h.read().strip()}")
            with socket.socket() as sock:
                if sock.connect_ex((spec["address"], spec["port"])) == 0:
                    return
            time.sleep(0.05)
        raise TestbedError(f"sshd of node {name} does not listen on "
                           f"{spec['address']}:{spec['port']}")

    def sshd_pid(self, name):
        """PID of this node's sshd, only if it really is ours (config path in argv)."""
        config = os.path.join(self.node_dir(name), "sshd_config")
        for pidfile in ("sshd.testbed-pid", "sshd.pid"):
            try:
                with open(os.path.join(self.node_dir(name), pidfile), encoding="utf-8") as h:
                    pid = int(h.read().strip())
            except (OSError, ValueError):
                continue
            if config in read_cmdline(pid):
                return pid
        return None

    def up_ct(self, node_name, vmid, ct):
        node = self.pct_node(node_name)
        ctdir = os.path.join(node.lxcpath, vmid)
        rootfs = os.path.join(ctdir, "rootfs")
        os.makedirs(ctdir, mode=0o755, exist_ok=True)
        write(os.path.join(ctdir, MARKER), f"{self.state_dir}\n")
        for sub in CT_DIRS:
            os.makedirs(os.path.join(rootfs, sub), mode=0o755, exist_ok=True)
        os.chmod(os.path.join(rootfs, "tmp"), 0o1777)
        os.chmod(os.path.join(rootfs, "var/tmp"), 0o1777)
        os.chmod(os.path.join(rootfs, "root"), 0o700)
        for link in USR_LINKS:
            target = os.path.join(rootfs, link)
            if os.path.islink(f"/{link}") and not os.path.lexists(target):
                os.symlink(os.readlink(f"/{link}"), target)
        hostname = ct["hostname"]
        etc = os.path.join(rootfs, "etc")
        write(os.path.join(etc, "hostname"), f"{hostname}\n")
        # PVE::LXC::Setup::Base update_etc_hosts: the CT's name on its static address (net0's
        # ip), else on 127.0.1.1, in a section of its own
        address = pct.parse_property_string(ct["net0"]).get("ip", "").split("/")[0] if ct["net0"] else ""
        write(os.path.join(etc, "hosts"), "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
                                          f"# --- BEGIN PVE ---\n{address or '127.0.1.1'} {hostname}\n"
                                          "# --- END PVE ---\n")
        write(os.path.join(etc, "passwd"),
              "root:x:0:0:root:/root:/bin/bash\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        write(os.path.join(etc, "group"), "root:x:0:\nnogroup:x:65534:\n")
        if not os.path.lexists(os.path.join(etc, "os-release")):
            os.symlink("../usr/lib/os-release", os.path.join(etc, "os-release"))
        usr_top = os.path.join(ctdir, "usr-top")
        self.write_fake_nvidia_smi(usr_top, ct["gpus"])
        self.write_init(usr_top)
        mounts = [
            # the host's /usr, read-only, with the CT's own tools on top where the field has
            # them (the NVIDIA driver installs nvidia-smi in /usr/bin)
            f"overlay usr overlay ro,lowerdir={usr_top}:/usr 0 0",
            # and without the host's /usr/local/bin: nothing in the CT is found there by luck
            f"{rootfs}/local-bin usr/local/bin none bind,ro 0 0",
            "tmpfs dev/shm tmpfs rw,nosuid,nodev,mode=1777,create=dir 0 0",
            # a Proxmox CT's systemd mounts a tmpfs on /run (systemd's mount-setup.c), so a CT
            # restart wipes the lock, pidfile and stop results there, and tini mounts nothing
            "tmpfs run tmpfs rw,nosuid,nodev,mode=755,create=dir 0 0",
            f"{TORCH_VENV} {TORCH_VENV.lstrip('/')} none bind,ro,optional,create=dir 0 0",
        ]
        for key in MOUNT_POINTS:
            if ct[key]:
                # a bind mount point (pve-container mounts mpN before the CT starts); its source keeps
                # its owner on the node, seen through the id map in an unprivileged CT
                source, target = pct.parse_mount_point(ct[key])
                os.makedirs(source, mode=0o755, exist_ok=True)
                if ct["unprivileged"] and key in ct["mapped_mounts"]:
                    os.chown(source, ID_MAP_BASE, ID_MAP_BASE)
                mounts.append(f"{source} {target.lstrip('/')} none bind,create=dir 0 0")
        # Device nodes a CUDA process would hold open, bound in as the Proxmox wiki's GPU passthrough
        # does it (bind,optional,create=file); /dev/null stands in for each
        mounts += [f"/dev/null dev/nvidia{i} none bind,optional,create=file 0 0" for i in range(ct["gpus"])]
        mounts.append("/dev/null dev/nvidiactl none bind,optional,create=file 0 0")
        id_map = []
        if ct["unprivileged"]:
            id_map = [f"lxc.idmap = {kind} 0 {ID_MAP_BASE} {ID_MAP_COUNT}" for kind in ("u", "g")]
            self.own_through_map(rootfs)
        write(os.path.join(ctdir, "config"), "\n".join([
            f"# dflash-testbed CT (state dir {self.state_dir}); removed by testbed.py down",
            f"lxc.uts.name = {hostname}",
            f"lxc.rootfs.path = dir:{rootfs}",
            "lxc.net.0.type = empty",
            "lxc.apparmor.profile = unconfined",
            *id_map,
            # the device nodes' access, as the wiki's lxc.cgroup2.devices.allow lines give it, for the
            # stand-in's c 1:3, on a host with cgroup v1's devices controller
            *(["lxc.cgroup.devices.allow = c 1:3 rwm"] if ct["unprivileged"] and DEVICES_V1 else []),
            "lxc.autodev = 1",
            # the CT sees its own cgroups, its memory limit among them: a Proxmox CT's systemd mounts them
            # in its cgroup namespace, and tini does not, so LXC does (force: it skips them in a namespace)
            "lxc.mount.auto = proc:rw sys:ro cgroup:mixed:force",
            *[f"lxc.mount.entry = {m}" for m in mounts],
            f"lxc.init.cmd = /usr/bin/tini -- {CT_INIT}",
            "lxc.signal.halt = SIGTERM",
            "lxc.tty.max = 0",
            f"lxc.log.file = {ctdir}/lxc.log",
            "lxc.log.level = WARN",
            "",
        ]))
        # what `pct set` gave the CT since (its hookscript) stays, as a node keeps a CT's config
        try:
            kept = [line for line in node.load_config(vmid).items() if line[0] == "hookscript"]
        except pct.PctError:
            kept = []
        write(node.conf_path(vmid), "\n".join([
            "# dflash-testbed",
            *[f"{key}: {value}" for key, value in kept],
            "arch: amd64",
            "cores: 2",
            f"hostname: {hostname}",
            "memory: 4096",
            "ostype: debian",
            f"rootfs: local:{vmid}/vm-{vmid}-disk-0.raw,size=8G",
            f"tags: {ct['tags']}",
            f"testbed_gpus: {ct['gpus']}",
            *([f"net0: {ct['net0']},type=veth"] if ct["net0"] else []),
            *[f"{key}: {ct[key]}" for key in MOUNT_POINTS if ct[key]],
            # an unprivileged CT with the Proxmox wiki's GPU passthrough lines (195: the NVIDIA devices'
            # major); the testbed's LXC config above binds its stand-ins
            *(["unprivileged: 1", "lxc.cgroup2.devices.allow: c 195:* rwm",
               *[f"lxc.mount.entry: /dev/nvidia{i} dev/nvidia{i} none bind,optional,create=file"
                 for i in range(ct["gpus"])]] if ct["unprivileged"] else []),
            "",
        ]))
        if not node.check_running(vmid):
            node.start(vmid)

    @staticmethod
    def own_through_map(rootfs):
        """The rootfs of an unprivileged CT owned through its id map, as pve-container's restore of a
        template leaves it (PVE::LXC::Create, the archive unpacked under lxc-usernsexec): each file's
        owner shifted by the map's base, once (a file the CT wrote is shifted already)."""
        for top, dirs, files in os.walk(rootfs):
            for name in [*dirs, *files]:
                path = os.path.join(top, name)
                st = os.lstat(path)
                if st.st_uid < ID_MAP_BASE:
                    os.lchown(path, st.st_uid + ID_MAP_BASE, st.st_gid + ID_MAP_BASE)
        st = os.lstat(rootfs)
        if st.st_uid < ID_MAP_BASE:
            os.lchown(rootfs, st.st_uid + ID_MAP_BASE, st.st_gid + ID_MAP_BASE)

    @staticmethod
    def write_init(usr_top):
        """The CT's init under tini: the loopback up, as a Proxmox CT's network setup brings it
        up (torchrun's rendezvous and gloo bind to it), then nothing but waiting."""
        os.makedirs(os.path.join(usr_top, "sbin"), mode=0o755, exist_ok=True)
        write(os.path.join(usr_top, CT_INIT[len("/usr/"):]),
              "#!/bin/sh\nip link set lo up\nexec sleep infinity\n", 0o755)

    @staticmethod
    def write_fake_nvidia_smi(usr_top, gpus):
        """usr_top/bin/nvidia-smi (fake_nvidia_smi.py) and the GPU count it reads."""
        for sub in ("bin", "share/nvidia-testbed"):
            os.makedirs(os.path.join(usr_top, sub), mode=0o755, exist_ok=True)
        shutil.copyfile(os.path.join(HERE, "fake_nvidia_smi.py"), os.path.join(usr_top, "bin", "nvidia-smi"))
        os.chmod(os.path.join(usr_top, "bin", "nvidia-smi"), 0o755)
        write(os.path.join(usr_top, "share", "nvidia-testbed", "gpu-count"), f"{gpus}\n")

    # -- down ------------------------------------------------------------------------
    def down(self):
        if not os.path.isdir(self.state_dir):
            log(f"down: nothing at {self.state_dir}")
            return
        with instance_lock(self.state_dir, remove=True):
            if not os.path.exists(os.path.join(self.state_dir, MARKER)):
                raise TestbedError(f"{self.state_dir} has no {MARKER} marker: not ours, left alone")
            nodes_root = os.path.join(self.state_dir, "nodes")
            names = sorted(os.listdir(nodes_root)) if os.path.isdir(nodes_root) else []
            for name in names:
                self.down_node(name)
            netns = pct.cluster_netns(self.state_dir)
            if netns in run(["ip", "netns", "list"]).stdout.split():
                run(["ip", "netns", "del", netns])
            remove_tree(self.state_dir)
        log(f"down: removed {self.state_dir}")

    def down_node(self, name):
        node = self.pct_node(name)
        if os.path.isdir(node.lxcpath):
            for vmid in sorted(os.listdir(node.lxcpath)):
                ctdir = os.path.join(node.lxcpath, vmid)
                if not os.path.exists(os.path.join(ctdir, MARKER)):
                    continue
                if not node.lxc_stop(vmid, "--kill"):
                    raise TestbedError(f"CT {vmid} on {name} does not stop")
                # --one-file-system: never descend into a mount, whatever happened
                run(["rm", "-rf", "--one-file-system", ctdir])
        pid = self.sshd_pid(name)
        if pid is not None:
            # the listener and its per-connection children
            for victim in [pid, *children_of(pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while read_cmdline(pid) and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                time.sleep(0.05)

    # -- status ------------------------------------------------------------------------
    def status(self):
        report = {}
        for name in self.nodes:
            node = self.pct_node(name)
            counter = os.path.join(node.dir, "pct-invocations.log")
            invocations = 0
            if os.path.exists(counter):
                with open(counter, encoding="utf-8") as handle:
                    invocations = sum(1 for _ in handle)
            report[name] = {
                "sshd_pid": self.sshd_pid(name),
                "pct_invocations": invocations,
                "cts": {vmid: node.check_running(vmid) for vmid in self.nodes[name]["cts"]},
            }
        return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--inventory", default=DEFAULT_INVENTORY)
    parser.add_argument("action", choices=("up", "down", "status"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("testbed: LXC containers and sshd on loopback need root", file=sys.stderr)
        return 1
    try:
        testbed = Testbed(args.inventory)
        if args.action == "status":
            print(json.dumps(testbed.status(), indent=2))
        else:
            getattr(testbed, args.action)()
    except (TestbedError, pct.PctError) as err:
        print(f"testbed: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
