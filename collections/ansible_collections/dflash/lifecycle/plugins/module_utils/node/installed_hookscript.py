# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""dflash-lifecycle's Proxmox hookscript, as the nodes run it (Python 3.8 compatible, the standard
library only: this file is installed whole, readable, after a ``#!/usr/bin/python3`` line, by
``make pve-hooks``: module_utils/node/hookscript.py script_text, module pve_hookscript).

pve-container runs a CT's hookscript on the node, as root, as ``<script> <vmid> <phase>``
(pve-guest-common PVE::GuestHelpers::exec_hookscript): ``pre-stop`` in PVE::LXC::vm_stop before
``lxc-stop`` (a stop, a shutdown, a reboot, a restart migration, HA, a node's shutdown alike), under
the CT's config lock and with no timeout of its own; ``post-start`` in PVE::LXC::vm_start. Its
output goes to the task's log. At those two phases this runs the run's own hook inside the CT
(``<lifecycle_dir>/hook <phase>``, through ``pct exec``): pre-stop stops the run in stages with its
checkpoint, post-start brings it back detached.

A CT's root is the least trusted party here (docs/security.md): it runs the trainer, its packages
and its data loaders, and it can replace that hook. So this script acts only on what the node
knows itself:

- the CT's policy, ``dflash-lifecycle-hook.d/<vmid>.json`` beside this script, root's, written by
  the install from the controller's inventory: the CT's name, where its hook lives, the bound of
  each phase (pre-stop's derived from the run's own stop budget), and a gang's other members by
  VMID. A gang's members are reached where the cluster says they run (``pvesh get
  /cluster/resources``), their nodes at the addresses of the cluster's membership (``pvesh get
  /cluster/status``: PVE::Cluster::remote_node_ip, what a migration uses), with Proxmox's own SSH
  command (PVE::SSHInfo::ssh_info_to_command). Every value is checked before use.
- nothing a CT prints reaches a shell, a command line, a path or a program: it is shown in the
  task's log only, a capped number of lines per CT, with its control characters removed, each
  line marked with the CT it came from;
- every wait on a CT ends at the phase's bound, set here: ``pct exec`` and the SSH to a member's
  node (with keepalives, and ``timeout`` on the far node) are ended there, and the log says what
  that may have cost.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import selectors
import shlex
import signal
import stat
import subprocess
import sys
import time
import unicodedata

PHASES = ("pre-stop", "post-start")
VMID_RE = re.compile(r"^[1-9][0-9]{2,8}$")  # pve-container's VM ID
NODE_RE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$")  # pve-common's pve-node format
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # an inventory name, as the install writes it
PATH_RE = re.compile(r"^(/[A-Za-z0-9_.-]+)+$")
POLICY_DIR = "dflash-lifecycle-hook.d"
DEFAULT_POLICY = {"lifecycle_dir": "/var/lib/dflash/lifecycle", "pre_stop_s": 3600.0, "post_start_s": 30.0,
                  "gang_margin_s": 3.0, "gang": []}
BOUNDS = {"pre_stop_s": (1.0, 86400.0), "post_start_s": (1.0, 3600.0), "gang_margin_s": (0.0, 60.0)}
# what a CT's output may show in the task's log: lines per CT, characters per line
LINES_SHOWN = 40
LINE_CHARS = 400
# the cluster's answers (pvesh), each; and the far node's own bound beyond this one's deadline
CLUSTER_TIMEOUT_S = 15.0
FAR_SLACK_S = 5
KILL_GRACE_S = 2.0
EXIT_GRACE_S = 1.0
# pve-cluster PVE::SSHInfo::ssh_info_to_command_base, with a connect timeout and keepalives: a node
# that stops answering ends the connection within 15 s, not with the TCP timeout
SSH_OPTIONS = ("-e", "none", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
               "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")
# in the CT: its hook, when the run's last launch left one (a CT without costs one pct exec)
IN_CT = ('if [ -x "$1" ]; then exec "$@"; fi; '
         'echo "dflash $2: no $1 in this CT (no run launched by dflash.lifecycle): nothing to do"')
_TEMPLATE_OPENER = re.compile(r"\{(?=[{%#])")


class PolicyError(ValueError):
    """The CT's policy file is not one the install writes; the message names the field."""


def printable(text, limit=LINE_CHARS, lines=False):
    """text as a person may be shown it when a CT wrote it: control, format and Unicode line and
    paragraph separator characters removed (no escape sequence reaches a terminal, no bidirectional
    override reorders a line, no U+2028 starts a line that str.splitlines() would read as another's;
    lines: the line breaks kept), a template opener broken up (``{{`` as ``{ {``: pasted into Ansible, or
    published to AWX, it templates nothing), at most limit characters. The controller shows what a
    CT wrote through this too (plugin_utils/untrusted.py)."""
    text = (text if isinstance(text, str) else str(text))[:4 * limit]  # the work bounded too
    if text.isascii() and text.isprintable() and "{" not in text:  # most text: nothing to remove
        return text if len(text) <= limit else text[:limit - 1] + "…"
    kept = "".join(" " if char == "\t" else char for char in text
                   if char == "\t" or (lines and char == "\n")
                   or unicodedata.category(char) not in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))
    kept = _TEMPLATE_OPENER.sub("{ ", kept)
    return kept if len(kept) <= limit else kept[:limit - 1] + "…"


def _number(policy, key):
    value = policy.get(key, DEFAULT_POLICY[key])
    low, high = BOUNDS[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise PolicyError(f"{key}: {value!r} is not a number of seconds from {low:g} to {high:g}")
    return float(value)


def checked_policy(vmid, policy):
    """The policy of CT vmid as this script uses it: every field checked (the install checks what it
    writes with this too). Raises PolicyError naming the field."""
    if not isinstance(policy, dict):
        raise PolicyError("the policy must be a mapping")
    unknown = sorted(set(policy) - {"name", *DEFAULT_POLICY})
    if unknown:
        raise PolicyError(f"unknown fields {', '.join(map(str, unknown))}")
    name = policy.get("name", f"CT{vmid}")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise PolicyError(f"name: {name!r} is not an inventory name ({NAME_RE.pattern})")
    directory = policy.get("lifecycle_dir", DEFAULT_POLICY["lifecycle_dir"])
    if not isinstance(directory, str) or not PATH_RE.match(directory) or "/../" in directory + "/" \
            or "/./" in directory + "/":
        raise PolicyError(f"lifecycle_dir: {directory!r} is not a plain absolute path")
    gang = policy.get("gang", [])
    if not isinstance(gang, list):
        raise PolicyError("gang: must be a list of {name, vmid}")
    members = []
    for index, member in enumerate(gang):
        if not isinstance(member, dict) or set(member) != {"name", "vmid"}:
            raise PolicyError(f"gang[{index}]: must be a mapping of name and vmid")
        if not isinstance(member["name"], str) or not NAME_RE.match(member["name"]):
            raise PolicyError(f"gang[{index}].name: {member['name']!r} is not an inventory name")
        if isinstance(member["vmid"], bool) or not VMID_RE.match(str(member["vmid"])):
            raise PolicyError(f"gang[{index}].vmid: {member['vmid']!r} is not a VM ID")
        if str(member["vmid"]) != str(vmid):
            members.append({"name": member["name"], "vmid": str(member["vmid"])})
    return {"name": name, "lifecycle_dir": directory.rstrip("/"), "gang": members,
            **{key: _number(policy, key) for key in BOUNDS}}


def _root_only(path):
    """Whether path is a regular file of root's that no one else may write (a file a CT's root could
    write through a mount of this storage is not the node's word)."""
    info = os.lstat(path)
    return stat.S_ISREG(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022


def read_policy(directory, vmid):
    """(policy, words): CT vmid's policy from directory (root's, checked), or the defaults with the
    words that say why."""
    path = os.path.join(directory, POLICY_DIR, f"{vmid}.json")
    words = "no policy for it on this node (make pve-hooks writes it)"
    try:
        if not _root_only(path):
            raise PolicyError("not a file of root's that only root may write")
        with open(path, encoding="utf-8") as handle:
            return checked_policy(vmid, json.load(handle)), None
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as err:
        words = f"its policy {path} is refused ({printable(err)})"
    defaults = f"the defaults hold (bounds {DEFAULT_POLICY['pre_stop_s']:g} s, {DEFAULT_POLICY['post_start_s']:g} s; no gang)"
    return checked_policy(vmid, {}), f"{words}: {defaults}"


def say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _cluster(argv, deadline):
    """pvesh's JSON answer, or raises OSError/ValueError."""
    left = min(CLUSTER_TIMEOUT_S, deadline - time.monotonic())
    if left <= 0:
        raise OSError("no time left")
    done = subprocess.run(["pvesh", "get", *argv, "--output-format", "json"], stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=left, check=False)
    if done.returncode != 0:
        raise OSError(f"pvesh get {argv[0]} failed (exit {done.returncode})")
    answer = json.loads(done.stdout)
    if not isinstance(answer, list):
        raise ValueError(f"pvesh get {argv[0]}: not a list")
    return [item for item in answer if isinstance(item, dict)]


def locate(members, deadline):
    """{vmid: (node or None for this node, address or None)} of the gang's members, where the
    cluster says they run; a member not found maps to the words that say why."""
    try:
        guests = _cluster(["/cluster/resources", "--type", "vm"], deadline)
        status = _cluster(["/cluster/status"], deadline)
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        return {m["vmid"]: f"the cluster's membership could not be read ({printable(err)})" for m in members}
    nodes = {item.get("name"): item for item in status if item.get("type") == "node"}
    here = next((name for name, item in nodes.items() if item.get("local") in (1, True)), None)
    found = {}
    for member in members:
        at = [g.get("node") for g in guests if g.get("type") == "lxc" and str(g.get("vmid")) == member["vmid"]]
        node = at[0] if len(at) == 1 else None
        if not isinstance(node, str) or not NODE_RE.match(node) or node not in nodes:
            found[member["vmid"]] = f"CT {member['vmid']} is not a CT of a node of this cluster"
            continue
        if node == here:
            found[member["vmid"]] = (None, None)
            continue
        try:
            address = str(ipaddress.ip_address(str(nodes[node].get("ip"))))
        except ValueError:
            found[member["vmid"]] = f"node {node} has no address in the cluster's membership"
            continue
        found[member["vmid"]] = (node, address)
    return found


class Source:
    """One process whose output is shown: a CT's hook, here or through a member's node."""

    def __init__(self, label, argv):
        self.label = label
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self.pending = b""
        self.shown = 0
        self.hidden = 0
        self.cut = False

    def take(self, data, last=False):
        """Show data's whole lines (and the rest when last), up to LINES_SHOWN; count the others."""
        self.pending += data
        lines = self.pending.split(b"\n")
        self.pending = lines.pop()
        if len(self.pending) > 4 * LINE_CHARS:  # a line without end is not kept whole in memory
            lines.append(self.pending)
            self.pending = b""
        if last and self.pending:
            lines.append(self.pending)
            self.pending = b""
        for line in lines:
            if self.shown < LINES_SHOWN:
                self.shown += 1
                say(f"[{self.label}] {printable(line.decode('utf-8', 'replace'))}")
            else:
                self.hidden += len(line) + 1

    def end(self):
        """End the process and all it started on this node (its own session), TERM then KILL."""
        self.cut = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(KILL_GRACE_S)
                return
            except subprocess.TimeoutExpired:
                continue


def pump(sources, deadline):
    """Show the sources' output until each has ended, or end them at the deadline. A process that
    exited is read for EXIT_GRACE_S more: a CT's process that keeps its output open holds nothing."""
    selector = selectors.DefaultSelector()
    for source in sources:
        os.set_blocking(source.process.stdout.fileno(), False)
        selector.register(source.process.stdout, selectors.EVENT_READ, source)
    exited = {}
    while selector.get_map() and time.monotonic() < deadline:
        for key, _events in selector.select(min(0.5, max(0.0, deadline - time.monotonic()))):
            source = key.data
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            source.take(data, last=not data)
            if not data:
                selector.unregister(key.fileobj)
        now = time.monotonic()
        for key in list(selector.get_map().values()):
            if key.data.process.poll() is not None and now - exited.setdefault(key.data, now) > EXIT_GRACE_S:
                selector.unregister(key.fileobj)
    selector.close()
    for source in sources:
        try:
            source.process.wait(max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            source.end()
        source.take(b"", last=True)
        source.process.stdout.close()
        if source.hidden:
            say(f"[{source.label}] ... {source.hidden} more bytes of its output not shown")


def in_ct_argv(vmid, hook, phase, moment):
    return ["pct", "exec", vmid, "--", "/bin/sh", "-c", IN_CT, "sh", hook, phase] + ([moment] if moment else [])


def member_argv(vmid, where, hook, phase, moment, deadline):
    """The command that runs member vmid's hook: pct exec here, else Proxmox's SSH to its node, the far
    pct exec bounded by timeout there too. Every word is one the checks above let through."""
    node, address = where
    local = in_ct_argv(vmid, hook, phase, moment)
    if node is None:
        return local
    far = ["timeout", "-k", str(FAR_SLACK_S), str(max(1, int(deadline - time.monotonic()))), *local]
    return ["ssh", *SSH_OPTIONS, "-o", f"HostKeyAlias={node}", f"root@{address}", shlex.join(far)]


def lost_words(phase):
    if phase == "pre-stop":
        return ("if its trainer still runs, the CT's stop ends it WITHOUT a checkpoint from this stop - every step "
                "since its last periodic checkpoint is lost; the CT's make status names its newest checkpoint")
    return "the run was not brought back; make status says what runs"


def member_lost_words(phase):
    if phase == "pre-stop":
        return ("its ranks are not stopped with this CT's and may wait in a collective until their timeout; the steps "
                "since the gang's last checkpoint may be lost")
    return "its member is not relaunched, and the gang stays down until make start"


def run_phase(vmid, phase, policy):
    """The run's hook of CT vmid at phase, and its gang's members', within the phase's bound."""
    bound = policy["pre_stop_s" if phase == "pre-stop" else "post_start_s"]
    deadline = time.monotonic() + bound
    hook = policy["lifecycle_dir"] + "/hook"
    found = locate(policy["gang"], deadline) if policy["gang"] else {}
    reached = []
    for member in policy["gang"]:
        if isinstance(found[member["vmid"]], str):
            say(f"dflash {phase}: {member['name']} (CT {member['vmid']}) NOT REACHED: {found[member['vmid']]}: "
                f"{member_lost_words(phase)}")
        else:
            reached.append(member)
    # a gang's members send their first signal at one moment, once every member was found
    moment = f"{time.time() + policy['gang_margin_s']:.3f}" if reached and phase == "pre-stop" else None
    own = Source(policy["name"], in_ct_argv(vmid, hook, phase, moment))
    members = [(member, Source(member["name"],
                               member_argv(member["vmid"], found[member["vmid"]], hook, phase, moment, deadline)))
               for member in reached]
    pump([own] + [source for _member, source in members], deadline)
    for member, source in members:
        if source.cut or source.process.returncode != 0:
            how = f"cut short at the bound of {bound:g} s" if source.cut else f"exit {source.process.returncode}"
            say(f"dflash {phase}: {member['name']} (CT {member['vmid']}) NOT REACHED, or its hook failed ({how}): "
                f"{member_lost_words(phase)}")
    if own.cut:
        say(f"dflash {phase}: the node cut CT {vmid}'s hook short at its bound of {bound:g} s (the node's policy for "
            f"the CT): Proxmox goes on; {lost_words(phase)}")
    elif own.process.returncode != 0:
        verb = "did not end well" if phase == "pre-stop" else "failed"
        say(f"dflash {phase}: the hook in CT {vmid} {verb} (exit {own.process.returncode}): {lost_words(phase)}")


def run_chain(directory, vmid, phase):
    """The CT's hookscript of before (the install's chain file names it), its exit status kept."""
    path = os.path.join(directory, POLICY_DIR, f"{vmid}.chain")
    try:
        if not _root_only(path):
            return 0
        with open(path, encoding="utf-8") as handle:
            chained = handle.read().strip()
    except OSError:
        return 0
    return subprocess.run([chained, vmid, phase], check=False).returncode


def main(argv):
    if len(argv) < 2 or not VMID_RE.match(argv[0]):
        say(f"usage: {os.path.basename(__file__)} <vmid> <phase> (pve-container's hookscript call)")
        return 0
    vmid, phase = argv[0], argv[1]
    directory = os.path.dirname(os.path.realpath(__file__))
    status = run_chain(directory, vmid, phase)
    if phase == "pre-start" and status != 0:  # its failure aborts the start, as its own would
        return status
    if phase in PHASES:
        policy, words = read_policy(directory, vmid)
        if words:
            say(f"dflash {phase}: CT {vmid}: {words}")
        run_phase(vmid, phase, policy)
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
