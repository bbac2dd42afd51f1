#!/usr/bin/python3
"""Stand-in for Proxmox VE's ``pct`` on a testbed node.

Faithful to proxmox/pve-container ``src/PVE/CLI/pct.pm`` (and the pve-common /
pve-guest-common code it calls) for the sub-commands this project uses: exec,
push, pull, status, list, start, stop, shutdown, reboot, config, set (memory, hookscript),
migrate.  Where the real tool
has a surprising behaviour the project must cope with, this one has it too:

* ``exec`` replaces itself with ``lxc-attach -n <vmid> --keep-env -- CMD``
  (pct.pm ``exec``: ``exec(@lxc_attach_cmd)``), with no wrapper process and no
  setsid, so a command run without a tty sees PGID 0 and SID 0 in the CT, and
  the exit status is the command's own (128+N when it dies by signal N).
* ``push`` creates the file in the CT's mount namespace and, for an unprivileged CT, its user
  namespace as its root, so it is owned through the CT's id map; ``pull`` opens the source in the
  mount namespace only, as the node's root (pct.pm ``push``/``pull``);
* ``push``/``pull`` run the copy in a forked worker (pct.pm ``fork_worker``);
  the CLI entry has no ``$upid_exit`` handler, so a failed copy prints the
  error on stderr and still exits 0.
* Errors raised with ``die`` end the real tool with exit status 255.
* pve-common's ``PVE::CLIHandler::run_cli_handler`` sets ``PATH=/sbin:/bin:/usr/sbin:/usr/bin``
  before any command runs, and ``exec`` keeps the environment (``--keep-env``): a command in
  the CT sees no ``/usr/local/bin``.
* A CT's ``hookscript`` (a ``<storage>:snippets/<file>`` volume) runs on the node as
  ``<script> <vmid> <phase>`` (pve-guest-common ``PVE::GuestHelpers::exec_hookscript``, which
  checks it with ``check_hookscript`` first): ``pre-start`` before the start, its failure
  aborting it, and ``post-start`` after it (pve-container ``PVE::LXC::vm_start``); ``pre-stop``
  before ``lxc-stop``, for ``stop``, ``shutdown``, ``reboot`` and a restart migration alike, with
  the CT's config lock held and no timeout, its failure only warned (``PVE::LXC::vm_stop``);
  ``post-stop`` once the CT stopped (``src/lxc-pve-poststop-hook``). The script's output goes to
  the task's output. The testbed's nodes share one file system, so a ``dir`` storage's ``path``
  in each node's ``etc/pve/storage.cfg`` is under that node's own directory; on a cluster it is
  the same path on every node, each node's own directory.

The node this copy belongs to is the directory above ``bin/`` (the testbed
installs one copy per node); each node sees only its own CTs.  Every call is
appended to ``pct-invocations.log`` in that directory, for the benchmarks.
"""

import contextlib
import fcntl
import grp
import json
import os
import pwd
import re
import sys
import time

VMID_RE = r"^[1-9][0-9]{2,8}$"
# pct.pm is installed here on a real node; Perl appends "at FILE line N." to a
# die() message without a trailing newline, and the real texts keep that.
PCT_PM = "/usr/share/perl5/PVE/CLI/pct.pm"
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
DIE_EXIT = 255  # perl's die() and CLIHandler's exit(-1)
CLI_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"  # pve-common CLIHandler.pm run_cli_handler
HELD_LOCKS = set()  # (node dir, vmid) of the config locks this process holds

USAGE = {
    "exec": "pct exec <vmid> [<extra-args>] [OPTIONS]",
    "push": "pct push <vmid> <file> <destination> [OPTIONS]",
    "pull": "pct pull <vmid> <path> <destination> [OPTIONS]",
    "status": "pct status <vmid> [OPTIONS]",
    "start": "pct start <vmid> [OPTIONS]",
    "stop": "pct stop <vmid> [OPTIONS]",
    "shutdown": "pct shutdown <vmid> [OPTIONS]",
    "config": "pct config <vmid> [OPTIONS]",
    "set": "pct set <vmid> [OPTIONS]",
    "reboot": "pct reboot <vmid> [OPTIONS]",
    "list": "pct list",
    "migrate": "pct migrate <vmid> <target> [OPTIONS]",
}


class PctError(Exception):
    """A ``die`` of the real tool: message on stderr, exit 255."""


class ParamError(PctError):
    """PVE::Exception parameter error: '400 Parameter verification failed.'"""

    def __init__(self, command, errors):
        lines = ["400 Parameter verification failed."]
        lines += [f"{key}: {msg}" for key, msg in errors.items()]
        super().__init__("\n".join(lines) + "\n\n" + USAGE[command] + "\n")


def parse_property_string(value):
    """{key: value} of a property string (PVE::JSONSchema parse_property_string: a netN's
    name=eth0,bridge=vmbr0,..., the options of an mpN)."""
    return dict(item.split("=", 1) for item in value.split(",") if "=" in item)


def parse_mount_point(value):
    """(volume or host directory, path in the CT) of an mpN property ('<volume>,mp=<path>,...')."""
    volume, *options = value.split(",")
    found = parse_property_string(",".join(options))
    if "mp" not in found:
        raise PctError(f"invalid mount point '{value}': no mp=<path>\n")
    return volume, found["mp"]


def cluster_netns(state_dir):
    """The testbed instance's cluster network: the namespace its bridges live in."""
    return "dflash-" + os.path.basename(os.path.abspath(state_dir))


def run(cmd, **kwargs):
    """subprocess.run, imported here: `pct exec`, most of the tests' thousands of calls, starts none,
    and the import is a fifth of this script's start-up."""
    import subprocess  # pylint: disable=import-outside-toplevel

    return subprocess.run(cmd, check=False, **kwargs)


class Node:
    """One testbed node: its pve config tree and its LXC path."""

    def __init__(self, node_dir):
        self.dir = os.path.abspath(node_dir)
        self.name = os.path.basename(self.dir)
        self.lxcpath = os.path.join(self.dir, "lxc")
        self.conf_dir = os.path.join(self.dir, "etc/pve/nodes", self.name, "lxc")

    def attach_argv(self, vmid, command, keep_env=True):
        """What `pct exec <vmid> -- command` runs. Real pct runs `lxc-attach -n <vmid>` against
        /var/lib/lxc; each testbed node has its own LXC path instead, hence -P. Nothing else differs."""
        return ["lxc-attach", "-P", self.lxcpath, "-n", str(vmid), "--keep-env" if keep_env else "--clear-env",
                "--", *command]

    # -- pve config (PVE::LXC::Config, PVE::AbstractConfig) --------------------
    def conf_path(self, vmid):
        return os.path.join(self.conf_dir, f"{vmid}.conf")

    def load_config(self, vmid):
        # pve-guest-common AbstractConfig::load_config: the path in the message
        # is relative to /etc/pve, the cluster file system.
        try:
            with open(self.conf_path(vmid), encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            raise PctError(
                f"Configuration file 'nodes/{self.name}/lxc/{vmid}.conf' does not exist\n"
            ) from None
        conf = {}
        for line in text.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            key, value = line.split(":", 1)
            conf[key.strip()] = value.strip()
        return conf

    def vmids(self):
        try:
            names = os.listdir(self.conf_dir)
        except FileNotFoundError:
            return []
        return sorted(int(n[:-5]) for n in names if n.endswith(".conf") and n[:-5].isdigit())

    # -- LXC state --------------------------------------------------------------
    def lxc(self, tool, vmid, *args, **kwargs):
        cmd = [tool, "-P", self.lxcpath, "-n", str(vmid), *args]
        return run(cmd, capture_output=True, text=True, **kwargs)

    def check_running(self, vmid):
        # PVE::LXC::check_running: a CT runs while its monitor's command socket is listed in
        # /proc/net/unix (list_active_containers, "similar test is used by lxccontainers.c");
        # with the node's own LXC path, the socket is @<lxcpath>/<vmid>/command
        if not os.path.isdir(os.path.join(self.lxcpath, str(vmid))):
            return False
        listed = f" @{self.command_socket(vmid)}"
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as table:
            return any(line.rstrip("\n").endswith(listed) for line in table)

    def command_socket(self, vmid):
        """The abstract name of the CT's LXC command socket, its monitor's (the node's LXC path's)."""
        return f"{self.lxcpath}/{vmid}/command"

    def init_pid(self, vmid):
        # PVE::LXC::find_lxc_pid
        out = self.lxc("lxc-info", vmid, "-p", "-H").stdout.strip()
        if not out.isdigit():
            raise PctError(f"unable to get PID for CT {vmid} (not running?)\n")
        return int(out)

    @contextlib.contextmanager
    def lock_config(self, vmid):
        # PVE::AbstractConfig::lock_config: flock on a per-CT lock file, re-entrant within one
        # process as PVE::Tools::lock_file_full is (vm_reboot's lock around vm_stop and vm_start)
        key = (self.dir, str(vmid))
        if key in HELD_LOCKS:
            yield
            return
        lock_dir = os.path.join(self.dir, "lock")
        os.makedirs(lock_dir, exist_ok=True)
        with open(os.path.join(lock_dir, f"pve-config-{vmid}.lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            HELD_LOCKS.add(key)
            try:
                yield
            finally:
                HELD_LOCKS.discard(key)

    # -- storage (PVE::Storage) -------------------------------------------------
    def storage_config(self):
        """{storage id: its options} of the node's storage.cfg (PVE::SectionConfig: '<type>: <id>'
        then indented '<key> <value>' lines)."""
        ids, current = {}, None
        try:
            with open(os.path.join(self.dir, "etc/pve/storage.cfg"), encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except FileNotFoundError:
            return ids
        for line in lines:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if not line[0].isspace() and ":" in line:
                kind, name = line.split(":", 1)
                current = ids[name.strip()] = {"type": kind.strip(), "storage": name.strip()}
            elif current is not None:
                key, _, value = line.strip().partition(" ")
                current[key] = value.strip() if value else "1"
        return ids

    def snippet_path(self, volid):
        """PVE::Storage::path of a '<storage>:snippets/<file>' volume on a storage with a path (the
        dir plugin's: <path>/snippets/<file>), with its type, as check_hookscript reads them."""
        match = re.match(r"^([a-z][a-z0-9\-_.]*[a-z0-9]):(.+)$", volid, re.IGNORECASE)
        if not match:
            raise PctError(f"unable to parse volume ID '{volid}'\n")
        storage, volname = match.groups()
        scfg = self.storage_config().get(storage)
        if scfg is None:
            raise PctError(f"storage '{storage}' does not exist\n")
        if not volname.startswith("snippets/") or "path" not in scfg:
            return None, None
        return os.path.join(scfg["path"], volname), "snippets"

    def check_hookscript(self, volid):
        # pve-guest-common PVE::GuestHelpers::check_hookscript
        path, kind = self.snippet_path(volid)
        if kind != "snippets":
            raise PctError(f"'{volid}' is not in the snippets directory\n")
        if not os.path.isfile(path):
            raise PctError(f"script '{volid}' does not exist\n")
        if not os.access(path, os.X_OK):
            raise PctError(f"script '{volid}' is not executable\n")
        return path

    def exec_hookscript(self, conf, vmid, phase, stop_on_error=False):
        """PVE::GuestHelpers::exec_hookscript: run_command([$hookscript, $vmid, $phase]), its
        output in the task's; an error dies where stop_on_error (pre-start), else it is warned.
        The node's own bin/ (where this testbed's pct is) leads the CLI's PATH, as /usr/sbin holds
        pct on a node."""
        if not conf.get("hookscript"):
            return
        try:
            path = self.check_hookscript(conf["hookscript"])
            env = dict(os.environ, PATH=os.path.join(self.dir, "bin") + ":" + CLI_PATH)
            sys.stdout.flush()
            res = run([path, str(vmid), phase], env=env)
            if res.returncode != 0:
                raise PctError(f"command '{path} {vmid} {phase}' failed: exit code {res.returncode}\n")
        except PctError as err:
            message = f"hookscript error for {vmid} on {phase}: {err}"
            if stop_on_error:
                raise PctError(message) from None
            sys.stderr.write(f"WARN: {message}")

    def start(self, vmid):
        # PVE::API2::LXC::Status vm_start -> PVE::LXC::vm_start
        conf = self.load_config(vmid)
        if self.check_running(vmid):
            raise PctError(f"CT {vmid} already running\n")
        with self.lock_config(vmid):
            # PVE::LXC::update_lxc_config writes the CT's memory limit into its LXC config before
            # every start (the memory cgroup charges its /dev/shm tmpfs too)
            key, limit = memory_limit(conf)
            self.exec_hookscript(conf, vmid, "pre-start", stop_on_error=True)
            res = self.lxc("lxc-start", vmid, "-s", f"lxc.{key}={limit}")
            if res.returncode != 0 or not self.check_running(vmid):
                sys.stderr.write(res.stderr)
                raise PctError(f"startup for container '{vmid}' failed\n")
            self.plug_nics(vmid)
            self.exec_hookscript(conf, vmid, "post-start")

    def plug_nics(self, vmid):
        """The CT's netN NICs: a veth pair whose host end, veth<vmid>i<N>, joins the bridge (what
        pve-container's lxcnetaddbr hook does on a node), the other end named and addressed in the
        CT as its distribution's network setup would. The bridge lives in the testbed's cluster
        network namespace, so the pair is made there: the host's own network is never touched."""
        conf = self.load_config(vmid)
        nics = sorted((int(key[3:]), parse_property_string(value))
                      for key, value in conf.items() if re.match(r"^net\d+$", key))
        if not nics:
            return
        netns = cluster_netns(os.path.dirname(os.path.dirname(self.dir)))
        pid = str(self.init_pid(vmid))
        for index, nic in nics:
            host_end = f"veth{vmid}i{index}"
            steps = [["ip", "-n", netns, "link", "add", host_end, "type", "veth", "peer", "name", nic["name"],
                      "netns", pid],
                     ["ip", "-n", netns, "link", "set", host_end, "master", nic["bridge"], "up"],
                     ["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "link", "set", nic["name"], "up"]]
            if nic.get("ip"):
                steps.append(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "addr", "add", nic["ip"], "dev", nic["name"]])
            for step in steps:
                res = run(step, capture_output=True, text=True)
                if res.returncode != 0:
                    raise PctError(f"unable to plug net{index} of CT {vmid} into {nic['bridge']}: {res.stderr.strip()}\n")

    def stop(self, vmid, kill=True, timeout=None, kill_after_timeout=False):
        # vm_stop / vm_shutdown -> PVE::LXC::vm_stop under the config lock: the pre-stop hook, then
        # lxc-stop --kill, or a clean shutdown with --nokill --timeout (forceStop kills afterwards);
        # post-stop from the CT's poststop hook once it stopped
        self.load_config(vmid)
        if not self.check_running(vmid):
            raise PctError(f"CT {vmid} not running\n")
        args = ["--kill"] if kill else [*([] if kill_after_timeout else ["--nokill"]), "--timeout", str(timeout)]
        with self.lock_config(vmid):
            conf = self.load_config(vmid)
            self.exec_hookscript(conf, vmid, "pre-stop")
            if not self.lxc_stop(vmid, *args, timeout=timeout):
                raise PctError("container did not stop\n")
            self.exec_hookscript(conf, vmid, "post-stop")

    def lxc_stop(self, vmid, *args, timeout=None):
        """lxc-stop ARGS, then PVE::LXC::vm_stop's wait: the CT's command socket, connected before,
        read until its monitor closes it (the CT has stopped); after a failed lxc-stop, a wait
        bounded by the timeout. Whether the CT stopped (a CT not running has)."""
        import socket  # pylint: disable=import-outside-toplevel  # a stop alone needs it

        monitor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with monitor:
            try:
                monitor.connect("\0" + self.command_socket(vmid))
            except OSError:  # ECONNREFUSED: no monitor, the CT is not running
                return True
            res = self.lxc("lxc-stop", vmid, *args)
            # vm_stop reads without a bound after a stop that worked; 60 s here, so that a
            # monitor that never lets go fails a test instead of hanging it
            monitor.settimeout(60 if res.returncode == 0 else (timeout or 10) + 5)
            try:
                return monitor.recv(1) == b""
            except OSError:  # the wait ran out (socket.timeout is an OSError)
                return False


def memory_limit(conf):
    """(LXC config key, bytes) of the CT's memory limit, as PVE::LXC::update_lxc_config writes it:
    'memory' MiB (512 when unset) as cgroup v1's memory.limit_in_bytes, else cgroup v2's memory.max
    (PVE writes memsw and memory.high beside it; the testbed's host has no swap to limit)."""
    limit = int(conf.get("memory") or 512) * 1024 * 1024
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return "cgroup2.memory.max", limit
    return "cgroup.memory.limit_in_bytes", limit


def setns_mount(pid, unprivileged=False):
    """Enter the mount namespace of ``pid`` (PVE::Tools::setns) and, for an unprivileged CT, its
    user namespace as its root (pct.pm push: setns CLONE_NEWUSER, then setgid(0) and setuid(0)), so
    that a file is created as the CT's root is mapped on the node."""
    import ctypes  # pylint: disable=import-outside-toplevel  # push and pull alone need it

    libc = ctypes.CDLL(None, use_errno=True)
    mnt = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    user = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY) if unprivileged else None
    try:
        if libc.setns(mnt, CLONE_NEWNS) != 0:
            raise PctError("failed to enter the container's mount namespace\n")
        os.chdir("/")
        if user is not None:
            if libc.setns(user, CLONE_NEWUSER) != 0:
                raise PctError("failed to enter the container's user namespace\n")
            os.setgid(0)
            os.setuid(0)
    finally:
        os.close(mnt)
        if user is not None:
            os.close(user)


def create_file(path, perms, user, group):
    """pct.pm create_file: O_EXCL first; an existing file is truncated in place."""
    uid = gid = None
    if user is not None:
        try:
            uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
        except KeyError:
            raise PctError(f"failed to get uid for: {user}\n") from None
    if group is not None:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise PctError(f"failed to get gid for: {group}\n") from None
    mode = None
    if perms is not None:
        try:
            mode = int(perms, 16) if perms.lower().startswith("0x") else int(perms, 8)
        except ValueError:
            raise PctError(f"invalid mode: '{perms}'\n") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0)
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    except FileExistsError:
        fd = None
    except OSError as err:
        raise PctError(f"failed to create file: {path}: {err.strerror}\n") from None
    if fd is None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError as err:
            raise PctError(f"failed to create file: {path}: {err.strerror}\n") from None
    if mode is not None:
        os.fchmod(fd, mode)
    if uid is not None or gid is not None:
        st = os.fstat(fd)
        try:
            os.fchown(fd, st.st_uid if uid is None else uid, st.st_gid if gid is None else gid)
        except OSError as err:
            raise PctError(f"failed to change file owner: {err.strerror}\n") from None
    return fd


def fork_worker(work):
    """RESTEnvironment::fork_worker in CLI sync mode: a failing worker prints
    its error on stderr, and the push/pull CLI entry still returns 0."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            work()
        except PctError as err:
            sys.stderr.write(str(err).rstrip("\n") + "\n")
            code = 1
        except OSError as err:
            sys.stderr.write(f"{err}\n")
            code = 1
        sys.stderr.flush()
        os._exit(code)
    os.waitpid(pid, 0)
    return 0


def copy_fd(src_fd, dst_fd):
    while chunk := os.read(src_fd, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst_fd, view) :]


# the options of pct's commands that pve-container's schema types boolean
BOOLEAN_OPTIONS = {"keep-env", "verbose", "forceStop", "restart", "online"}


def parse(command, argv, positional, options):
    """CLIHandler-style parsing: fixed positionals, then --opt value pairs;
    for exec, whatever follows ``--`` (or is not an option) is extra-args."""
    values, extra = {}, []
    rest = list(argv)
    for name in positional:
        if not rest or rest[0] == "--":
            raise ParamError(command, {name: "property is missing and it is not optional"})
        values[name] = rest.pop(0)
    while rest:
        token = rest.pop(0)
        if token == "--":
            extra.extend(rest)
            break
        if token.startswith("--") and token[2:] in BOOLEAN_OPTIONS & options:
            # PVE::JSONSchema get_options: a boolean is "$prop:s", its value optional ('' is 1)
            values[token[2:]] = rest.pop(0) if rest and not rest[0].startswith("-") else "1"
        elif token.startswith("--") and token[2:] in options:
            if not rest:
                raise ParamError(command, {token[2:]: "missing value"})
            values[token[2:]] = rest.pop(0)
        elif command == "exec":
            extra.append(token)
            extra.extend(rest)
            break
        else:
            raise PctError(f"Unknown option: {token[2:] if token.startswith('--') else token}\n"
                           f"400 unable to parse option\n{USAGE[command]}\n")
    if "vmid" in values and not re.match(VMID_RE, values["vmid"]):
        raise ParamError(command, {"vmid": "invalid format - value does not look like a valid VM ID"})
    return values, extra


def perl_bool(value):
    return value.lower() not in ("0", "false", "no", "off")


def cmd_exec(node, argv):
    args, extra = parse("exec", argv, ["vmid"], {"keep-env"})
    vmid = args["vmid"]
    node.load_config(vmid)
    if not node.check_running(vmid):
        raise PctError(f"container '{vmid}' not running!\n")
    if not extra:
        raise PctError(f"missing command at {PCT_PM} line 246.\n")
    attach = node.attach_argv(vmid, extra, perl_bool(args.get("keep-env", "1")))
    os.execvp(attach[0], attach)  # an exec, as pct's


def cmd_push(node, argv):
    args, _ = parse("push", argv, ["vmid", "file", "destination"], {"perms", "user", "group"})
    vmid = args["vmid"]
    perms = args.get("perms")
    if perms is not None and not perms.startswith("0"):
        perms = "0" + perms  # pct.pm: "assume octal as default"
    with node.lock_config(vmid):
        if not node.check_running(vmid):
            raise PctError("can only push files to a running CT\n")
        unprivileged = perl_bool(node.load_config(vmid).get("unprivileged", "0"))

        def work():
            pid = node.init_pid(vmid)
            try:
                src = os.open(args["file"], os.O_RDONLY)
            except OSError:
                raise PctError(f"failed to open {args['file']} for reading\n") from None
            setns_mount(pid, unprivileged)
            dst = create_file(args["destination"], perms, args.get("user"), args.get("group"))
            copy_fd(src, dst)

        return fork_worker(work)


def cmd_pull(node, argv):
    args, _ = parse("pull", argv, ["vmid", "path", "destination"], {"perms", "user", "group"})
    vmid = args["vmid"]
    perms = args.get("perms")
    if perms is not None and not perms.startswith("0"):
        perms = "0" + perms
    with node.lock_config(vmid):
        if not node.check_running(vmid):
            raise PctError(f"can only pull files from a running VM at {PCT_PM} line 664.\n")

        def work():
            pid = node.init_pid(vmid)
            dst = create_file(args["destination"], perms, args.get("user"), args.get("group"))
            setns_mount(pid)
            try:
                src = os.open(args["path"], os.O_RDONLY)
            except OSError as err:
                raise PctError(f"failed to open {args['path']}: {err.strerror}\n") from None
            copy_fd(src, dst)

        return fork_worker(work)


def cmd_status(node, argv):
    args, _ = parse("status", argv, ["vmid"], {"verbose"})
    node.load_config(args["vmid"])
    print("status: " + ("running" if node.check_running(args["vmid"]) else "stopped"))
    return 0


def cmd_config(node, argv):
    args, _ = parse("config", argv, ["vmid"], set())
    for key, value in sorted(node.load_config(args["vmid"]).items()):
        print(f"{key}: {value}")
    return 0


def cmd_set(node, argv):
    """PVE::API2::LXC::Config update_vm, for 'memory', 'hookscript' and '--delete hookscript': the
    config is written under the CT's lock; a hookscript is checked first (PVE::LXC::Config
    update_pct_config: check_hookscript); a running CT gets a new memory limit at once
    (vmconfig_hotplug_pending: PVE::LXC::Cgroup change_memory_limit), which fails when the CT
    already uses more."""
    args, _ = parse("set", argv, ["vmid"], {"memory", "hookscript", "delete"})
    vmid = args["vmid"]
    if not {"memory", "hookscript", "delete"} & set(args):
        raise PctError("no options specified\n")
    if "memory" in args and (not re.match(r"^[1-9][0-9]*$", args["memory"]) or int(args["memory"]) < 16):
        raise ParamError("set", {"memory": "value must have a minimum value of 16"})
    deleted = [key for key in re.split(r"[,;\s]+", args.get("delete", "")) if key]
    if set(deleted) - {"hookscript"}:
        raise ParamError("set", {"delete": "the testbed's pct deletes only hookscript"})
    node.load_config(vmid)
    if "hookscript" in args:
        node.check_hookscript(args["hookscript"])
    with node.lock_config(vmid):
        path = node.conf_path(vmid)
        changed = {key: args[key] for key in ("memory", "hookscript") if key in args}
        with open(path, encoding="utf-8") as handle:
            lines = [line for line in handle.read().splitlines()
                     if line.split(":", 1)[0] not in set(changed) | set(deleted)]
        for key, value in changed.items():
            lines.insert(1, f"{key}: {value}")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        if "memory" in args and node.check_running(vmid):
            key, limit = memory_limit(node.load_config(vmid))
            res = node.lxc("lxc-cgroup", vmid, key.split(".", 1)[1], str(limit))
            if res.returncode != 0:
                raise PctError(f"unable to hotplug memory: {res.stderr.strip()}\n")
    return 0


def cmd_list(node, argv):
    parse("list", argv, [], set())
    rows = []
    for vmid in node.vmids():
        conf = node.load_config(vmid)
        status = "running" if node.check_running(vmid) else "stopped"
        rows.append((vmid, status, conf.get("lock", ""), conf.get("hostname", f"CT{vmid}")))
    if rows:  # pct.pm: "return if !scalar(@$res);" -- no header when empty
        fmt = "%-10s %-10s %-12s %-20s"
        print(fmt % ("VMID", "Status", "Lock", "Name"))
        for row in rows:
            print(fmt % row)
    return 0


def cmd_start(node, argv):
    args, _ = parse("start", argv, ["vmid"], set())
    node.start(args["vmid"])
    return 0


def cmd_stop(node, argv):
    args, _ = parse("stop", argv, ["vmid"], set())
    node.stop(args["vmid"], kill=True)
    return 0


def cmd_shutdown(node, argv):
    args, _ = parse("shutdown", argv, ["vmid"], {"timeout", "forceStop"})
    # PVE::API2::LXC::Status vm_shutdown: vm_stop($vmid, 0, $timeout, $forceStop)
    node.stop(args["vmid"], kill=False, timeout=int(args.get("timeout", "60")),
              kill_after_timeout=perl_bool(args.get("forceStop", "0")))
    return 0


def cmd_reboot(node, argv):
    """PVE::LXC::vm_reboot under the config lock: nothing when the CT is not running, else
    vm_stop($vmid, 0, $timeout, 1) (a shutdown that kills once the timeout ran out: pre-stop and
    post-stop hooks included) and vm_start (pre-start, post-start)."""
    args, _ = parse("reboot", argv, ["vmid"], {"timeout"})
    vmid = args["vmid"]
    node.load_config(vmid)
    with node.lock_config(vmid):
        if not node.check_running(vmid):
            return 0
        node.stop(vmid, kill=False, timeout=int(args.get("timeout", "60")), kill_after_timeout=True)
        node.start(vmid)
    return 0


def cmd_migrate(node, argv):
    """PVE::API2::LXC migrate_vm and PVE::LXC::Migrate: a restart migration (the CT is shut down,
    its volume and config move to the target, it starts there); offline when it is stopped. The
    CT's directory (its root file system: releases, checkpoints, logs) moves whole, as its volume
    does on shared or migrated storage; the config moves last, as in phase3."""
    values, _extra = parse("migrate", argv, ["vmid", "target"], {"restart", "online", "timeout"})
    vmid, target = values["vmid"], values["target"]
    if target == node.name:
        raise ParamError("migrate", {"target": "target is local node."})
    target_dir = os.path.join(os.path.dirname(node.dir), target)
    if not os.path.isdir(os.path.join(target_dir, "etc/pve/nodes", target)):
        raise PctError(f"no such cluster node '{target}'\n")
    node.load_config(vmid)
    running = node.check_running(vmid)
    if running and perl_bool(values.get("online", "0")):
        raise PctError("lxc live migration is currently not implemented\n")
    if running and not perl_bool(values.get("restart", "0")):
        raise PctError("can't migrate running container without --online or --restart\n")
    dest = Node(target_dir)
    if running:
        node.stop(vmid, kill=False, timeout=int(values.get("timeout", 180)))
    with node.lock_config(vmid):
        old, new = os.path.join(node.lxcpath, vmid), os.path.join(dest.lxcpath, vmid)
        os.makedirs(dest.lxcpath, exist_ok=True)
        os.rename(old, new)
        config = os.path.join(new, "config")
        with open(config, encoding="utf-8") as handle:
            text = handle.read().replace(old + "/", new + "/").replace(old + " ", new + " ")
        with open(config, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.makedirs(dest.conf_dir, exist_ok=True)
        os.rename(node.conf_path(vmid), dest.conf_path(vmid))
    print("migration finished successfully")
    if running:
        dest.start(vmid)
    return 0


COMMANDS = {
    "exec": cmd_exec, "push": cmd_push, "pull": cmd_pull, "status": cmd_status,
    "config": cmd_config, "set": cmd_set, "list": cmd_list, "start": cmd_start, "stop": cmd_stop,
    "shutdown": cmd_shutdown, "reboot": cmd_reboot, "migrate": cmd_migrate,
}


def record_invocation(node, argv):
    line = json.dumps({"time": time.time(), "pid": os.getpid(), "argv": argv}) + "\n"
    try:
        fd = os.open(os.path.join(node.dir, "pct-invocations.log"),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except PermissionError:
        return  # a non-root caller, refused below before it can do anything
    try:
        os.write(fd, line.encode())  # one O_APPEND write: concurrent calls do not interleave
    finally:
        os.close(fd)


def main(argv):
    # pve-common PVE::CLIHandler::run_cli_handler sets this before any command runs; `exec`
    # passes it into the CT with --keep-env, so a command there sees no /usr/local/bin
    os.environ["PATH"] = CLI_PATH
    node = Node(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    record_invocation(node, argv)
    try:
        # RPCEnvironment::setup_default_cli_env, before any command runs
        if os.geteuid() != 0:
            raise PctError("please run as root\n")
        if not argv or argv[0] not in COMMANDS:
            name = argv[0] if argv else ""
            sys.stderr.write(f"ERROR: unknown command 'pct {name}'\n"
                             "USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n")
            return DIE_EXIT
        return COMMANDS[argv[0]](node, argv[1:])
    except PctError as err:
        sys.stderr.write(str(err))
        return DIE_EXIT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
