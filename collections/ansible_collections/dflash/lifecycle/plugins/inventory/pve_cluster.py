# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: pve_cluster
short_description: The CTs of a Proxmox VE cluster where they run now, asked over the nodes' root SSH
version_added: 0.3.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Asks the cluster where each container runs - C(pvesh get /cluster/resources --type vm
    --output-format json) on the first node of O(nodes) that answers, over the same root SSH the
    C(dflash.lifecycle.pct) connection uses (the node's C(ansible_host), C(ansible_port),
    C(ansible_user), C(ansible_ssh_private_key_file), C(ansible_ssh_common_args) and
    C(ansible_ssh_extra_args), from the inventory that names the nodes, its group_vars included).
    No API token is needed.
  - Every container with the tag O(tag) (or whose name matches O(name_pattern)) becomes a host of
    O(group), named by its name, with C(pve_node) (the node it runs on now), C(ansible_pct_vmid),
    C(pve_status) and C(pve_tags). Other inventory variables (group_vars, host_vars) apply by host
    name, as with a static map; a CT that moved between nodes (HA, maintenance, C(pct migrate)) is
    found where it is.
  - The node names of the cluster (the C(node) field) must be the inventory names of the nodes.
    A node that does not answer is skipped with a warning; when none answers, the source fails
    naming each node and why.
  - The file must be named C(*pve_cluster.yml) (or C(.yaml)) and come after the file that names
    the nodes (an inventory directory is read in name order).
options:
  plugin:
    description: The name of this plugin.
    type: str
    required: true
    choices: [dflash.lifecycle.pve_cluster]
  nodes:
    description: Inventory names of the nodes to ask, in order.
    type: list
    elements: str
    required: true
  tag:
    description: The Proxmox tag of the CTs to take (C(tags) in their config).
    type: str
  name_pattern:
    description: A regex on the CT's name, for CTs to take by name (either it or O(tag) must match).
    type: str
  group:
    description: The group the CTs are put in.
    type: str
    default: dflash_trainers
  pvesh:
    description: The pvesh command on the node.
    type: str
    default: pvesh
  connect_timeout:
    description: Seconds to wait for a node's SSH connection.
    type: int
    default: 10
"""

EXAMPLES = r"""
# inventory/cluster/hosts.yml names the nodes (ansible_host ...); this file, beside it as
# inventory/cluster/pve_cluster.yml, puts every CT tagged dflash into dflash_trainers
plugin: dflash.lifecycle.pve_cluster
nodes: [pve1, pve2]
tag: dflash
"""

import json
import re
import shlex
import subprocess

from ansible.errors import AnsibleParserError
from ansible.inventory.helpers import get_group_vars
from ansible.plugins.inventory import BaseInventoryPlugin
from ansible.utils.vars import combine_vars
from ansible.vars.plugins import get_vars_from_inventory_sources

from ansible_collections.dflash.lifecycle.plugins.module_utils.node import installed_hookscript
from ansible_collections.dflash.lifecycle.plugins.module_utils.node.installed_hookscript import printable

# pve-common's dns-name format: a CT's hostname in its Proxmox config
DNS_NAME = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*$")
SSH_VARS = ("ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
            "ansible_ssh_common_args", "ansible_ssh_extra_args")


class InventoryModule(BaseInventoryPlugin):
    NAME = "dflash.lifecycle.pve_cluster"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("pve_cluster.yml", "pve_cluster.yaml"))

    def parse(self, inventory, loader, path, cache=False):
        super().parse(inventory, loader, path, cache=cache)
        self._read_config_data(path)
        if not self.get_option("tag") and not self.get_option("name_pattern"):
            raise AnsibleParserError(f"{path}: set tag or name_pattern: which CTs to take")
        answer, asked = None, []
        for name in self.get_option("nodes"):
            try:
                answer = self.resources(name, getattr(inventory, "processed_sources", []))
                break
            except (OSError, ValueError, subprocess.SubprocessError) as err:
                asked.append(f"{name}: {' '.join(str(err).split())}")
                self.display.warning(f"{self.NAME}: node {name} did not answer ({asked[-1]}); asking the next")
        if answer is None:
            raise AnsibleParserError(f"{path}: no node of {self.get_option('nodes')} answered: " + "; ".join(asked))
        group = self.inventory.add_group(self.get_option("group"))
        for ct in self.checked(self.chosen(answer)):
            host = self.inventory.add_host(str(ct["name"]), group=group)
            for key, value in (("pve_node", ct["node"]), ("ansible_pct_vmid", int(ct["vmid"])),
                               ("pve_status", ct.get("status")), ("pve_tags", self.tags(ct))):
                self.inventory.set_variable(host, key, value)

    def checked(self, cts):
        """The containers whose name, node and VMID have Proxmox's own forms (a name becomes a host
        name, a node a delegate, a VMID a word of `pct exec`); another one is left out, said."""
        for ct in cts:
            name, node, vmid = str(ct.get("name", "")), str(ct.get("node", "")), str(ct.get("vmid", ""))
            if DNS_NAME.match(name) and installed_hookscript.NODE_RE.match(node) and installed_hookscript.VMID_RE.match(vmid):
                yield ct
            else:
                self.display.warning(f"{self.NAME}: a container left out - its name {printable(name)!r}, node "
                                     f"{printable(node)!r} or VMID {printable(vmid)!r} is not of Proxmox's form")

    @staticmethod
    def tags(ct):
        return [t for t in re.split(r"[;,\s]+", str(ct.get("tags") or "")) if t]

    def chosen(self, answer):
        """The containers that the tag or the name pattern selects (pve-manager's resources: one
        entry per guest, type lxc for a container)."""
        tag, pattern = self.get_option("tag"), self.get_option("name_pattern")
        for ct in answer:
            if ct.get("type") != "lxc" or ct.get("template"):
                continue
            if (tag and tag in self.tags(ct)) or (pattern and re.search(pattern, str(ct.get("name", "")))):
                yield ct

    def node_vars(self, name, sources):
        """A node's connection variables as the inventory gives them, group_vars included (the vars
        plugins' stage "all", as constructed's use_vars_plugins: by default they wait for the task
        stage), templated."""
        host = self.inventory.get_host(name)
        if host is None:
            raise ValueError(f"{name} is not a host of the inventory read before this file")
        groups = host.get_groups()
        variables = get_group_vars(groups)
        variables = combine_vars(variables, get_vars_from_inventory_sources(self.loader, sources, groups, "all"))
        variables = combine_vars(variables, host.get_vars())
        variables = combine_vars(variables, get_vars_from_inventory_sources(self.loader, sources, [host], "all"))
        self.templar.available_variables = variables
        return {key: self.templar.template(variables[key]) for key in SSH_VARS if key in variables}

    def resources(self, name, sources):
        found = self.node_vars(name, sources)
        command = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.get_option('connect_timeout')}"]
        if found.get("ansible_port"):
            command += ["-p", str(found["ansible_port"])]
        if found.get("ansible_ssh_private_key_file"):
            command += ["-i", str(found["ansible_ssh_private_key_file"])]
        for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            command += shlex.split(str(found.get(key) or ""))
        command += [f"{found.get('ansible_user') or 'root'}@{found.get('ansible_host') or name}",
                    f"{self.get_option('pvesh')} get /cluster/resources --type vm --output-format json"]
        res = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if res.returncode != 0:
            raise ValueError(f"exit {res.returncode}: {res.stderr.strip()[-300:]}")
        answer = json.loads(res.stdout)
        if not isinstance(answer, list):
            raise ValueError(f"pvesh answered {type(answer).__name__}, not a list of resources")
        return answer
