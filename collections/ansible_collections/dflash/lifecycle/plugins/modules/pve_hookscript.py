#!/usr/bin/python
# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: pve_hookscript
short_description: Install this project's Proxmox hookscript on a node, or set it on a CT
version_added: 0.2.0
author: DFlash lifecycle maintainers (@dflash-lifecycle)
description:
  - Runs on a Proxmox VE node. Without O(vmid) it installs the project's hookscript (this collection's
    C(module_utils/node/installed_hookscript.py), a readable Python file) as
    C(<storage>:snippets/dflash-lifecycle-hook.py) on this node, after checking that O(storage)
    exists, is enabled, is available on O(node) and holds snippets (C(pvesh get /storage/<id>)),
    and writes beside it, root's, each CT's policy (O(policies) - what the hookscript acts on,
    never what a CT says) and the chain files of the CTs that chain to another hookscript
    (O(chains)). Run it on every node a CT may start on - a restart migration or an HA relocation
    starts the CT on another node, whose pve-container then runs the hookscript from its own storage.
  - The shell script of before 0.4.0 (C(dflash-lifecycle-hook.sh)), where a node still has it,
    becomes a link to the new script, so a CT that still names it runs the new one.
  - With O(vmid) it sets the hookscript on that CT (C(pct set <vmid> --hookscript <volume>)). A CT
    whose hookscript is someone else's is refused, naming the script, unless O(chain) names that
    script; the project's hookscript then runs it first, in every phase, with its exit status
    kept (a pre-start failure still aborts the start).
  - O(state=absent) removes the setting from the CT (the chained script, if any, is set back), or
    the chain files of O(vmids) from the node. The script itself stays on the node - other CTs, this
    node's or any that may migrate here, may name it, and a CT whose hookscript is missing cannot
    start (pve-container's pre-start check dies); remove it by hand once no CT names it.
  - What the hookscript does is docs/pve-hooks.md of this project - C(pre-stop) stops the run in
    stages with its checkpoint before the CT stops, C(post-start) brings it back.
options:
  storage:
    description: The storage for the script; it must hold C(snippets) and be available on O(node).
    type: str
    required: true
  node:
    description: This node's name in the cluster (what a storage's C(nodes) list names).
    type: str
    required: true
  policies:
    description:
      - Node mode - C({vmid - policy}) of the CTs this install manages, each written to
        C(dflash-lifecycle-hook.d/<vmid>.json) beside the script. A policy holds the CT's C(name),
        its C(lifecycle_dir) (where the run's hook lives in the CT), the bounds C(pre_stop_s) and
        C(post_start_s) after which the node ends the CT's hook, C(gang_margin_s), and C(gang), the
        C({name, vmid}) of every member of the CT's gang. Each is checked before anything is written.
    type: dict
    default: {}
  chains:
    description:
      - Node mode - C({vmid - volume}) of the CTs whose own earlier hookscript the project's one runs
        first; each volume is resolved on this node and must exist there.
    type: dict
    default: {}
  vmids:
    description:
      - Node mode - the CTs this install manages; a chain file of one of them that O(chains) no longer
        names is removed, and with O(state=absent) their policies too.
    type: list
    elements: int
    default: []
  vmid:
    description: The CT whose hookscript setting is set (CT mode).
    type: int
  chain:
    description: CT mode - the CT's hookscript of before, which the project's one runs first. Without it a CT with another hookscript is refused.
    type: str
  state:
    description: V(present) installs or sets; V(absent) unsets the CT's, or removes the policies and chain files (never the script).
    type: str
    choices: [present, absent]
    default: present
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: none
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Checks everything and reports what would change; writes nothing.
  diff_mode:
    support: full
    details: The script's content and the policies (node mode), the CT's hookscript setting (CT mode).
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Install the hookscript on every node (the CTs' nodes and their migration targets)
  dflash.lifecycle.pve_hookscript:
    storage: local
    node: "{{ inventory_hostname }}"
    policies:
      200: {name: ct200, lifecycle_dir: /var/lib/dflash/lifecycle, pre_stop_s: 3703, post_start_s: 30,
            gang_margin_s: 3, gang: []}

- name: Set it on ct200, keeping the hookscript it had
  dflash.lifecycle.pve_hookscript:
    storage: local
    node: pve1
    vmid: 200
    chain: local:snippets/backup-hook.pl
  delegate_to: pve1
"""

RETURN = r"""
path:
  description: The script's path on this node.
  returned: always
  type: str
  sample: /var/lib/vz/snippets/dflash-lifecycle-hook.py
volume:
  description: The script's volume, as a CT's C(hookscript) names it.
  returned: always
  type: str
  sample: local:snippets/dflash-lifecycle-hook.py
hookscript:
  description: CT mode - the CT's hookscript setting before and after (null - none).
  returned: when vmid is set
  type: dict
  sample: {before: null, after: local:snippets/dflash-lifecycle-hook.sh}
ours:
  description: CT mode - whether the CT's hookscript is this project's after the call.
  returned: when vmid is set
  type: bool
privileged:
  description: >-
    CT mode - whether the CT is privileged (no C(unprivileged: 1) in its configuration): its root is the
    node's root, and the hook's threat model (docs/security.md) does not hold there.
  returned: when vmid is set
  type: bool
chained:
  description: Node mode - C({vmid - path}) of the scripts run first; CT mode - the chained volume.
  returned: always
  type: raw
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.lifecycle.plugins.module_utils.node import ct_config, hookscript, installed_hookscript


def _storage(module, storage):
    """pvesh get /storage/<id>: its options, or None when it does not exist."""
    rc, out, err = module.run_command(["pvesh", "get", f"/storage/{storage}", "--output-format", "json"])
    if rc != 0:
        if "does not exist" in err:
            return None
        module.fail_json(msg=f"pvesh get /storage/{storage} failed (exit {rc}): {err.strip()}; nothing was changed")
    return json.loads(out)


def _dir_of(module, storage, node):
    try:
        return hookscript.snippets_dir(storage, _storage(module, storage), node)
    except hookscript.Refused as err:
        module.fail_json(msg=f"{err}; nothing was changed")


def _write(module, path, text, mode):
    """Write text to path unless it is there already; returns changed."""
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text and (os.stat(path).st_mode & 0o777) == mode:
                return False
    except OSError:
        pass
    if not module.check_mode:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    return True


def _remove(module, path):
    if not os.path.lexists(path):
        return False
    if not module.check_mode:
        os.unlink(path)
    return True


def _policies(module, policies, result):
    """{vmid: the JSON text of its policy}, each checked as the hookscript checks it."""
    texts = {}
    for vmid, policy in sorted(policies.items()):
        if not installed_hookscript.VMID_RE.match(str(vmid)):
            module.fail_json(msg=f"policies: {vmid!r} is not a VM ID; nothing was changed", **result)
        try:
            texts[str(vmid)] = json.dumps(installed_hookscript.checked_policy(vmid, policy), sort_keys=True, indent=1) + "\n"
        except installed_hookscript.PolicyError as err:
            module.fail_json(msg=f"the policy of CT {vmid}: {err}; nothing was changed", **result)
    return texts


def _legacy_link(module, folder):
    """The pre-0.4.0 script, where it is still there, as a link to the new one. Returns changed."""
    legacy = os.path.join(folder, hookscript.LEGACY_SCRIPT_NAME)
    if not os.path.lexists(legacy) or (os.path.islink(legacy) and os.readlink(legacy) == hookscript.SCRIPT_NAME):
        return False
    if not module.check_mode:
        tmp = f"{legacy}.tmp-{os.getpid()}"
        os.symlink(hookscript.SCRIPT_NAME, tmp)
        os.rename(tmp, legacy)
    return True


def node_mode(module, p):
    folder = _dir_of(module, p["storage"], p["node"])
    path = os.path.join(folder, hookscript.SCRIPT_NAME)
    chains_dir = os.path.join(folder, hookscript.CHAIN_DIR)
    result = {"path": path, "volume": hookscript.volume(p["storage"]), "chained": {}}
    if p["state"] == "absent":
        # never the script: another CT may name it, and a CT whose hookscript is gone cannot start
        changed = False
        for vmid in p["vmids"]:
            changed |= _remove(module, os.path.join(chains_dir, f"{vmid}.chain"))
            changed |= _remove(module, os.path.join(chains_dir, f"{vmid}.json"))
        module.exit_json(changed=changed, **result)
    policies = _policies(module, p["policies"], result)
    for vmid, chained in sorted(p["chains"].items()):
        match = hookscript.VOLUME_RE.match(str(chained))
        if not match:
            module.fail_json(msg=f"pve_hook_chain of CT {vmid}: '{chained}' is not a <storage>:snippets/<file> volume; "
                             "nothing was changed", **result)
        chained_path = os.path.join(_dir_of(module, match.group(1), p["node"]), match.group(2)[len("snippets/"):])
        if not os.access(chained_path, os.X_OK):
            module.fail_json(msg=f"pve_hook_chain of CT {vmid}: script '{chained}' does not exist or is not executable "
                             f"on node {p['node']} ({chained_path}); nothing was changed", **result)
        result["chained"][str(vmid)] = chained_path
    script = hookscript.script_text()
    before = {}
    for name in [path] + [os.path.join(chains_dir, f"{vmid}.json") for vmid in policies]:
        try:
            with open(name, encoding="utf-8") as handle:
                before[name] = handle.read()
        except OSError:
            before[name] = ""
    changed = _write(module, path, script, 0o755)
    changed |= _legacy_link(module, folder)
    for vmid, text in policies.items():
        changed |= _write(module, os.path.join(chains_dir, f"{vmid}.json"), text, 0o644)
    for vmid in p["vmids"]:
        if str(vmid) not in result["chained"]:
            changed |= _remove(module, os.path.join(chains_dir, f"{vmid}.chain"))
    for vmid, chained_path in result["chained"].items():
        changed |= _write(module, os.path.join(chains_dir, f"{vmid}.chain"), chained_path + "\n", 0o644)
    after = dict({path: script}, **{os.path.join(chains_dir, f"{vmid}.json"): text for vmid, text in policies.items()})
    diff = [{"before": before[name], "after": text, "before_header": name, "after_header": name}
            for name, text in after.items() if before[name] != text]
    module.exit_json(changed=changed, diff=diff, **result)


def ct_mode(module, p):
    vmid = p["vmid"]
    ours = hookscript.volume(p["storage"])
    rc, out, err = module.run_command(["pct", "config", str(vmid)])
    if rc != 0:
        module.fail_json(msg=f"pct config {vmid} failed (exit {rc}): {err.strip()}; nothing was changed")
    current = ct_config.value(out, "hookscript")
    result = {"volume": ours, "path": None, "chained": p["chain"], "privileged": not ct_config.unprivileged(out)}
    if p["state"] == "absent":
        after = current
        if hookscript.is_ours(current):
            after = p["chain"]
            command = ["pct", "set", str(vmid)] + (["--hookscript", p["chain"]] if p["chain"] else ["--delete", "hookscript"])
            if not module.check_mode:
                module.run_command(command, check_rc=True)
        module.exit_json(changed=after != current, hookscript={"before": current, "after": after}, ours=False,
                         diff={"before": f"hookscript: {current}\n", "after": f"hookscript: {after}\n"}, **result)
    try:
        set_to, _chain = hookscript.plan_ct(vmid, current, ours, p["chain"])
    except hookscript.Refused as err:
        module.fail_json(msg=f"{err}; nothing was changed", hookscript={"before": current, "after": current}, **result)
    result["path"] = os.path.join(_dir_of(module, p["storage"], p["node"]), hookscript.SCRIPT_NAME)
    if set_to and not module.check_mode:
        rc, out, err = module.run_command(["pct", "set", str(vmid), "--hookscript", set_to])
        if rc != 0:
            module.fail_json(msg=f"pct set {vmid} --hookscript {set_to} failed (exit {rc}): {err.strip()}",
                             hookscript={"before": current, "after": current}, **result)
    after = set_to or current
    module.exit_json(changed=bool(set_to), hookscript={"before": current, "after": after}, ours=after == ours,
                     diff={"before": f"hookscript: {current}\n", "after": f"hookscript: {after}\n"}, **result)


def main():
    module = AnsibleModule(
        argument_spec={
            "storage": {"type": "str", "required": True},
            "node": {"type": "str", "required": True},
            "policies": {"type": "dict", "default": {}},
            "chains": {"type": "dict", "default": {}},
            "vmids": {"type": "list", "elements": "int", "default": []},
            "vmid": {"type": "int"},
            "chain": {"type": "str"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
        },
        supports_check_mode=True,
    )
    if module.params["vmid"] is None:
        node_mode(module, module.params)
    ct_mode(module, module.params)


if __name__ == "__main__":
    main()
