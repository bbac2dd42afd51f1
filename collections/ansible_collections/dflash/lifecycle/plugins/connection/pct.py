# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Connection plugin: OpenSSH to a Proxmox VE node, then ``pct exec <vmid> --``."""

from __future__ import annotations

DOCUMENTATION = r"""
name: pct
short_description: Run tasks inside a Proxmox VE LXC container through the node's pct, over OpenSSH
version_added: 0.1.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - The inventory host is the container; the plugin logs in to the Proxmox node that holds it
    with the OpenSSH client, exactly as M(ansible.builtin.ssh) does, and wraps every command in
    C(pct exec <vmid> -- /bin/sh -c <command>), so modules (builtin ones and this collection's)
    run inside the container, where the training process lives.
  - This plugin extends C(ansible.builtin.ssh). Every option of that plugin applies unchanged and
    is read from the same places (C(ansible_ssh_*) and C(ansible_host)/C(ansible_port)/
    C(ansible_user) variables, the C([ssh_connection]) section of C(ansible.cfg), C(ANSIBLE_SSH_*)
    environment variables), so ControlPersist and pipelining keep working. One connection to a
    node is shared by every container on it.
  - Commands never get a tty (the ssh option C(use_tty) is forced off). With a tty C(lxc-attach)
    allocates a pty and calls setsid, merges stderr into stdout and hides the process-group facts
    the staged stop relies on; without one the command sees PGID 0 and SID 0, as the trainer does.
  - File transfer is a pipelined write through C(pct exec) (C(cat > path) in the container, the
    file on stdin) rather than a copy to the node followed by C(pct push). One SSH round trip
    instead of three, no copy of the file (possibly a secret) left on the node's disk, and a
    real exit status, where C(pct push) exits 0 even when the copy fails.
options:
  vmid:
    description:
      - VMID of the container on the node, as C(pct list) shows it.
      - Must match C(^[1-9][0-9]{2,8}$), the rule of Proxmox VE's C(pve-vmid) format.
    type: str
    required: true
    vars:
      - name: ansible_pct_vmid
  pct_executable:
    description:
      - The C(pct) command on the node.
    type: str
    default: pct
    vars:
      - name: ansible_pct_executable
    env:
      - name: ANSIBLE_PCT_EXECUTABLE
  node:
    description:
      - "Inventory name of the node holding the container, used in messages - a stopped container
        is reported as C(CT 200 on pve1 is stopped), and one whose configuration the node does not
        hold as C(CT 200 is not on pve2 (pct: Configuration file ... does not exist): it may have
        moved to another node), each a task failure, not an SSH failure."
    type: str
    vars:
      - name: pve_node
notes:
  - The node is reached at C(ansible_host); an inventory usually derives it from the node's own
    inventory entry, for example C(ansible_host={{ hostvars[pve_node]['ansible_host'] }}).
  - C(pct exec) passes the environment of the SSH session into the container (C(--keep-env),
    the Proxmox VE 8 default).
seealso:
  - name: pct(1)
    description: Proxmox VE container toolkit.
    link: https://pve.proxmox.com/pve-docs/pct.1.html
"""

EXAMPLES = r"""
# inventory/production/hosts.yml
# all:
#   children:
#     proxmox_nodes:
#       hosts:
#         pve1: {ansible_host: 10.1.2.6}
#     dflash_trainers:
#       vars:
#         ansible_connection: dflash.lifecycle.pct
#         ansible_host: "{{ hostvars[pve_node]['ansible_host'] }}"
#         ansible_user: root
#       hosts:
#         ct200: {pve_node: pve1, ansible_pct_vmid: 200}

- name: Run a module inside CT 200
  hosts: ct200
  tasks:
    - name: Show the GPUs the container sees
      ansible.builtin.command: nvidia-smi -L
      changed_when: false
"""

import os
import re
import shlex

import yaml

from ansible import constants as C
from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection.ssh import Connection as SSHConnection
from ansible.plugins.loader import connection_loader
from ansible.utils.display import Display

from ansible_collections.dflash.lifecycle.plugins.module_utils.node.installed_hookscript import printable

display = Display()

FQCN = "dflash.lifecycle.pct"
# what an error shows of what the CT's side wrote
CT_WORDS = 4000
VMID_RE = re.compile(r"^[1-9][0-9]{2,8}$")  # pve-common JSONSchema pve_verify_vmid


def register_options():
    """Offer this plugin's options together with every option of ansible.builtin.ssh.

    The plugin loader registers the options of our DOCUMENTATION under our name; the task
    executor then passes a connection only the variables its registered options name. So
    before the first connection is made, the union is registered under our name, and the ssh
    options (with their variables, ini keys and environment variables) are ours too, without
    copying ssh's documentation. Called when a connection is created, never at import: the
    plugin can be imported (ansible-doc, ansible-test) before ssh's options are loaded.
    """
    if "use_tty" in C.config.get_configuration_definitions("connection", __name__):
        return
    # ansible-playbook has read ssh's options under the short name "ssh" before it forks the
    # workers; asking for "ansible.builtin.ssh" would parse ssh's long DOCUMENTATION again in
    # each worker (about 10 ms a task). The C YAML loader reads our own in 0.3 ms, not 3.
    ssh_class = connection_loader.get("ssh", class_only=True)
    ssh_options = C.config.get_configuration_definitions("connection", ssh_class._load_name)
    if "use_tty" not in ssh_options:
        raise AnsibleError(f"{FQCN}: could not read the options of ansible.builtin.ssh")
    own_options = yaml.load(DOCUMENTATION, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["options"]
    C.config.initialize_plugin_configuration_definitions("connection", __name__, {**ssh_options, **own_options})


def pct_exec_command(pct_executable, vmid, command):
    """The node-side command line that runs ``command`` (a shell string) in the CT.

    Two quoting layers: the node's login shell removes the outer one, so pct
    receives ``/bin/sh -c <command>`` as separate arguments and hands them to
    lxc-attach unchanged.
    """
    return "{0} exec {1} -- /bin/sh -c {2}".format(
        shlex.quote(pct_executable), shlex.quote(str(vmid)), shlex.quote(command))


class Connection(SSHConnection):
    """ssh to the node, ``pct exec`` into the container."""

    transport = FQCN

    def __init__(self, *args, **kwargs):
        register_options()
        super().__init__(*args, **kwargs)

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        # See DOCUMENTATION: a tty changes the process tree and merges stderr.
        self.set_option("use_tty", False)

    @property
    def vmid(self):
        vmid = to_text(self.get_option("vmid")).strip()
        if not VMID_RE.match(vmid):
            raise AnsibleError(
                f"ansible_pct_vmid={vmid!r} for host {self._play_context.remote_addr!r}: "
                "a Proxmox VE VMID is a number from 100 to 999999999")
        return vmid

    def _in_container(self, command):
        return pct_exec_command(self.get_option("pct_executable"), self.vmid, command)

    def _stopped_ct(self, error):
        """pct's exit status 255 reads as an SSH failure to the ssh plugin; a CT that is stopped
        ("container 'N' not running!") or not on this node (its configuration is not in the node's
        directory: pve-container's load_config) is said as what it is, in one line."""
        text = to_text(error)
        where = self.get_option("node") or self._play_context.remote_addr
        if f"container '{self.vmid}' not running!" in text:
            return AnsibleError(f"CT {self.vmid} on {where} is stopped (pct status: stopped); start it "
                                f"with `pct start {self.vmid}` on the node")
        missing = re.search(r"Configuration file '[^']*/lxc/%s\.conf' does not exist" % self.vmid, text)
        if missing:
            return AnsibleError(f"CT {self.vmid} is not on {where} (pct: {missing.group(0)}): it may have "
                                "moved to another node")
        # anything else: the ssh plugin's words around what the command wrote on stderr, and a command
        # in the CT that exits 255 is the CT's to write (docs/security.md): shown cleaned
        return AnsibleConnectionFailure(printable(text, CT_WORDS, lines=True))

    def exec_command(self, cmd, in_data=None, sudoable=True):
        try:
            return super().exec_command(self._in_container(cmd), in_data=in_data, sudoable=sudoable)
        except AnsibleConnectionFailure as err:
            raise self._stopped_ct(err) from None

    def _run_in_container(self, command, in_data):
        self.host = self.get_option("host") or self._play_context.remote_addr
        ssh_cmd = self._build_command(self.get_option("ssh_executable"), "ssh", self.host,
                                      self._in_container(command))
        returncode, stdout, stderr = self._run(ssh_cmd, in_data, sudoable=False, checkrc=False)
        error = self._stopped_ct(AnsibleConnectionFailure(to_text(stderr)))
        if returncode == 255 and not isinstance(error, AnsibleConnectionFailure):
            raise error
        return returncode, stdout, printable(to_text(stderr), CT_WORDS, lines=True)

    def put_file(self, in_path, out_path):
        # ConnectionBase.put_file only logs; the ssh parent's would use sftp/scp to the node.
        super(SSHConnection, self).put_file(in_path, out_path)
        display.vvv(f"PUT {in_path} TO {out_path} (CT {self.vmid}, piped through pct exec)",
                    host=self._play_context.remote_addr)
        if not os.path.exists(to_bytes(in_path, errors="surrogate_or_strict")):
            raise AnsibleFileNotFound(f"file or module does not exist: {in_path}")
        with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as handle:
            data = handle.read()
        returncode, _stdout, stderr = self._run_in_container(f"cat > {shlex.quote(out_path)}", data)
        if returncode != 0:
            raise AnsibleConnectionFailure(
                f"failed to write {out_path} in CT {self.vmid} (rc={returncode}): "
                f"{to_text(stderr).strip()}")

    def fetch_file(self, in_path, out_path):
        super(SSHConnection, self).fetch_file(in_path, out_path)
        display.vvv(f"FETCH {in_path} TO {out_path} (CT {self.vmid}, piped through pct exec)",
                    host=self._play_context.remote_addr)
        returncode, stdout, stderr = self._run_in_container(f"cat < {shlex.quote(in_path)}", None)
        if returncode != 0:
            raise AnsibleConnectionFailure(
                f"failed to read {in_path} in CT {self.vmid} (rc={returncode}): "
                f"{to_text(stderr).strip()}")
        with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as handle:
            handle.write(stdout)
